"""Locust shapes that run a timeline of stages (`loadtests/stages.py`)."""

from __future__ import annotations

from locust import LoadTestShape

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
