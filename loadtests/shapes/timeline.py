"""Locust shapes that run a timeline of stages (`loadtests/stages.py`)."""

from __future__ import annotations

from locust import LoadTestShape
from locust.stats import calculate_response_time_percentile

from loadtests.settings import LoadSettings
from loadtests.stages import Stage, stage_index


class StagedShape(LoadTestShape):
    """A shape that runs `stages()` in order, then stops the test."""

    abstract = True
    chat_users_fixed: int | None = None
    """When set, exactly this many chat users run (the locustfile applies it as `ChatUser.fixed_count`)."""

    def settings(self) -> LoadSettings:
        return self.runner.environment.loadtest_settings  # type: ignore[union-attr]

    def stages(self, s: LoadSettings) -> list[Stage]:
        raise NotImplementedError

    def engine_time_s(self) -> float:
        return self.get_run_time() / self.settings().time_scale

    def tick(self) -> tuple[int, float] | None:
        stages = self.stages(self.settings())
        i = stage_index(stages, self.engine_time_s())
        if i is None or self.stop_before(i):
            return None
        return stages[i].users, stages[i].spawn_rate

    def stop_before(self, index: int) -> bool:
        return False


class KneeWatch:
    """Short TTFT p99 of each completed stage, from Locust's live `TTFT short` row (ms, Locust's rounding)."""

    def __init__(self) -> None:
        self.index: int | None = None
        self._start: dict[int, int] = {}
        self.p99_ms: list[float | None] = []

    def crossed(self, index: int, entry, threshold_ms: float) -> bool:
        """Called every tick with the stage index; True once a completed stage's p99 is above the threshold."""
        if index != self.index:
            if self.index is not None:
                self.p99_ms.append(p99_since(entry, self._start))
            self.index = index
            self._start = dict(entry.response_times)
        return any(p is not None and p > threshold_ms for p in self.p99_ms)


def p99_since(entry, start: dict[int, int]) -> float | None:
    diff = {k: v - start.get(k, 0) for k, v in entry.response_times.items() if v - start.get(k, 0) > 0}
    n = sum(diff.values())
    return float(calculate_response_time_percentile(diff, n, 0.99)) if n else None
