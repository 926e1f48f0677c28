"""Load shapes as timelines of stages (engine seconds). No Locust import: the benchmark's process (Ray)
reads them too, and importing Locust would monkey-patch it with gevent."""

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
    """Seed 000's story: one session (a document, then questions beside it in a chat session); then four
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
