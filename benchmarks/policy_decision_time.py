"""Policy decision time per pass at 100, 1,000 and 10,000 waiting requests.

The scan stops at the running-slot limit, the pass budget or the lookahead bound, so a pass's
cost must not grow with the queue: the printed 10k/1k ratio should stay near 1 (target <= 1.2).
Each queue holds a blocked long request at its head (the seed's case) and the same mix behind it (one seed),
so only its length differs.
"""

from __future__ import annotations

import random
import time

from scheduler.planner import PassPlanner
from scheduler.sim.request import SimRequest, TrafficClass
from scheduler.sim.schedulers import CandidateView
from scheduler.snapshot import Candidate, QueueSnapshot

SIZES = (100, 1_000, 10_000)
REPEATS = 7
PASSES = 2_000


def queue(n: int, rng: random.Random) -> list[SimRequest]:
    reqs = [SimRequest("blocked", 70_689, 256, 0.0, TrafficClass.LONG)]
    for i in range(n - 1):
        prompt = rng.choice([30, 200, 1500, 40_000, 90_000])
        reqs.append(SimRequest(f"r{i}", prompt, 64, 0.0))
    return reqs


def _snapshot(n: int) -> QueueSnapshot:
    rng = random.Random(0)  # the same head of queue at every size: only the length differs
    return QueueSnapshot(
        waiting=CandidateView(queue(n, rng)),
        free_kv_tokens=68_534,
        free_running_slots=8,
        continuing=[Candidate("doc", 60_000, 0)],
        num_decoding=4,
    )


def _sample_us(planner: PassPlanner, snap: QueueSnapshot) -> float:
    start = time.perf_counter()
    for _ in range(PASSES):
        planner.plan(snap)
    return (time.perf_counter() - start) / PASSES * 1e6


def time_per_pass_us() -> dict[int, float]:
    """Per size, the fastest of `REPEATS` samples, the sizes taken in turn within each repeat: on a shared
    machine other load only ever adds time, and it then falls on every size alike."""
    snaps = {n: _snapshot(n) for n in SIZES}
    planners = {n: PassPlanner() for n in SIZES}
    samples: dict[int, list[float]] = {n: [] for n in SIZES}
    for _ in range(REPEATS):
        for n in SIZES:
            samples[n].append(_sample_us(planners[n], snaps[n]))
    return {n: min(xs) for n, xs in samples.items()}


def main() -> None:
    results = time_per_pass_us()
    for n, us in results.items():
        print(f"waiting={n:>6}: {us:8.1f} us per pass")
    print(f"ratio 10k/1k = {results[10_000] / results[1_000]:.2f} (target <= 1.2)")


if __name__ == "__main__":
    main()
