"""The up-and-down ramp's timeline (`up_down.py`), apart from its Locust class: the benchmark's process (Ray) reads
it too, and importing Locust would monkey-patch that process with gevent.

Low, then up in steps, a plateau, down the same steps, low again: the load an autoscaler must follow both ways.
It reads the step ramp's knobs: the low level is `--ramp-step-users`, each step adds or removes that many, the
plateau is `--ramp-max-users`, and every step lasts `--ramp-step-s` (engine seconds).
"""

from __future__ import annotations

from loadtests.settings import LoadSettings
from loadtests.stages import FAST_SPAWN_PER_S, Stage

LOW_HEAD_STEPS = 2
"""Steps at the low level before the climb: the run starts from a settled, lightly loaded app."""
PEAK_STEPS = 3
"""Steps on the plateau: longer than Serve's default upscale delay (30 s) at the benchmark's step lengths, so a
policy that wants more replicas gets them while the load is still high."""
LOW_TAIL_STEPS = 3
"""Steps at the low level after the descent: time for a policy to give replicas back."""


def up_down_levels(s: LoadSettings) -> list[int]:
    """Users in each step, in order (one entry a step)."""
    step, peak = s.ramp_step_users, max(s.ramp_step_users, s.ramp_max_users)
    climb = list(range(2 * step, peak, step))  # the levels strictly between low and the plateau
    return [step] * LOW_HEAD_STEPS + climb + [peak] * PEAK_STEPS + climb[::-1] + [step] * LOW_TAIL_STEPS


def up_down_stages(s: LoadSettings) -> list[Stage]:
    """One stage per run of equal levels (the low head, each climbing step, the plateau, ...), labelled by phase."""
    levels = up_down_levels(s)
    peak_at = levels.index(max(levels))
    stages: list[Stage] = []
    for i, users in enumerate(levels):
        until_s = s.ramp_step_s * (i + 1)
        if stages and stages[-1].users == users:
            stages[-1] = Stage(until_s, users, FAST_SPAWN_PER_S, stages[-1].label)
            continue
        phase = "plateau" if users == levels[peak_at] else "up" if i < peak_at else "down"
        if users == s.ramp_step_users and phase != "plateau":  # a plateau at the low level is no ramp: one stage
            phase = "low" if i < peak_at else "low again"
        stages.append(Stage(until_s, users, FAST_SPAWN_PER_S, f"{users} users, {phase}"))
    return stages
