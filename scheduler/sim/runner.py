"""Run a workload to completion on a virtual clock."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tqdm import tqdm

from scheduler.interleave import PassKind
from scheduler.sim.engine import SimEngine, StepResult, StepScheduler
from scheduler.sim.presets import Preset
from scheduler.sim.request import SimRequest

MAX_PASSES = 2_000_000


@dataclass
class RunResult:
    requests: list[SimRequest]
    steps: list[StepResult]
    preset: Preset
    policy: str

    @property
    def end_s(self) -> float:
        return self.steps[-1].end_s if self.steps else 0.0


class StuckError(RuntimeError):
    """Requests wait but nothing can run and nothing will arrive (e.g. a request larger than free KV forever)."""


def run(
    requests: Iterable[SimRequest],
    preset: Preset,
    scheduler: StepScheduler,
    policy: str = "",
    step_clock: bool = False,
    progress: bool | None = False,
    before_step: Callable[[SimEngine], None] | None = None,
    after_step: Callable[[SimEngine, StepResult], None] | None = None,
) -> RunResult:
    """Simulate until every request finishes. With `step_clock`, each pass lasts one time unit and
    arrival times are pass indices (the step-comparison article's model); otherwise passes last what the cost
    model says.
    `before_step` / `after_step` observe the engine around each pass (invariant checks)."""
    reqs = [copy.deepcopy(r) for r in sorted(requests, key=lambda r: r.arrival_s)]
    engine = SimEngine(preset.cost, scheduler)
    steps: list[StepResult] = []
    now, i = 0.0, 0
    # progress=None: a bar on a terminal only.
    bar = tqdm(total=len(reqs), disable=None if progress is None else not progress, unit="req", leave=False)
    while i < len(reqs) or not engine.idle:
        while i < len(reqs) and reqs[i].arrival_s <= now:
            engine.add(reqs[i])
            i += 1
        if engine.idle:
            now = reqs[i].arrival_s
            continue
        if before_step is not None:
            before_step(engine)
        res = engine.step(now)
        if after_step is not None:
            after_step(engine, res)
        if res.kind is PassKind.IDLE:
            if i < len(reqs):
                now = reqs[i].arrival_s
            elif not engine.idle:  # idle: it only processed the last pass's results, the finishing requests left
                raise StuckError(f"{len(engine.waiting)} requests wait but none can be admitted")
            continue
        if step_clock:
            res.duration_s = 1.0
        steps.append(res)
        now = res.end_s
        bar.update(len(res.finished))
        if len(steps) > MAX_PASSES:
            raise StuckError(f"more than {MAX_PASSES} passes")
    bar.close()
    return RunResult(reqs, steps, preset, policy)
