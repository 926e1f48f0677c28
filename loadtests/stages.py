"""Load shapes as timelines of stages (engine seconds). No Locust import: the benchmark's process (Ray)
reads them too, and importing Locust would monkey-patch it with gevent. Also the step ramp's knee watch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loadtests.settings import LoadSettings

FAST_SPAWN_PER_S = 100.0
"""Users join a stage at once: the shapes model sessions that start together."""


@dataclass(frozen=True)
class Stage:
    until_s: float
    """End of the stage, engine seconds from the start of the run."""
    users: int
    spawn_rate: float
    label: str


def stage_index(stages: Sequence[Stage], t_s: float) -> int | None:
    """Index of the stage running at engine time `t_s`; None after the last."""
    for i, stage in enumerate(stages):
        if t_s < stage.until_s:
            return i
    return None


def article_stages(s: LoadSettings) -> list[Stage]:
    """The article's story: one session (a document, then questions beside it in a chat session); then four
    sessions (three new documents beside the chat session). The chat user is fixed at one
    (`chat_users_fixed`); the first document user stays, idle, after its `--docs-per-user 1`."""
    return [
        Stage(s.article_single_s, 2, FAST_SPAWN_PER_S, "one document + chat"),
        Stage(s.article_single_s + s.article_four_s, 5, FAST_SPAWN_PER_S, "three documents + chat"),
    ]


def ramp_stages(s: LoadSettings) -> list[Stage]:
    steps = -(-s.ramp_max_users // s.ramp_step_users)
    return [
        Stage(
            s.ramp_step_s * (i + 1),
            min(s.ramp_max_users, s.ramp_step_users * (i + 1)),
            FAST_SPAWN_PER_S,
            f"{min(s.ramp_max_users, s.ramp_step_users * (i + 1))} users",
        )
        for i in range(steps)
    ]


def soak_stages(s: LoadSettings) -> list[Stage]:
    return [Stage(s.soak_s, s.soak_users, FAST_SPAWN_PER_S, f"soak, {s.soak_users} users")]


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
    return percentile_of_counts(diff, 0.99) if n else None


def percentile_of_counts(counts: dict[int, int], q: float) -> float:
    """Locust's percentile of a `{response time: count}` histogram (its `calculate_response_time_percentile`
    rule: the smallest time with at most (1 - q) of the requests above it)."""
    n = sum(counts.values())
    above = 0
    for t in sorted(counts, reverse=True):
        above += counts[t]
        if n - above <= int(n * q):
            return float(t)
    return 0.0
