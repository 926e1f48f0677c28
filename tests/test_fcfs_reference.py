"""With skip-ahead, fair share and adaptive passes off, the policy core takes upstream sglang's
decisions exactly. The reference below is upstream's loop written out plainly (the oracle)."""

import random

from scheduler.config import PolicyConfig
from scheduler.planner import PassPlanner
from scheduler.snapshot import QueueSnapshot
from tests.factories import FCFS, cand, snap


def upstream_reference(s: QueueSnapshot, chunk_budget: int) -> list[tuple[str, int]]:
    """sglang 0.5.23: continue the chunked request, then scan FCFS; stop at the first capacity
    rejection, when the chunk budget is spent, or after cutting a request."""
    grants, rem_chunk = [], chunk_budget
    free, slots = s.free_kv_tokens, s.free_running_slots
    for c in s.continuing:
        take = min(c.extend_tokens, rem_chunk)
        grants.append((c.rid, take))
        rem_chunk -= take
    for c in s.waiting:
        if rem_chunk <= 0 or slots <= 0 or c.need_tokens > free:
            break
        if c.extend_tokens <= rem_chunk:
            grants.append((c.rid, c.extend_tokens))
            rem_chunk -= c.extend_tokens
            free -= c.need_tokens
            slots -= 1
            continue
        trunc = rem_chunk // s.granule_tokens * s.granule_tokens
        if trunc > 0:
            grants.append((c.rid, trunc))
        break
    return grants


def random_snapshot(rng: random.Random) -> QueueSnapshot:
    def size():
        return rng.choice([rng.randint(1, 200), rng.randint(200, 4000), rng.randint(4000, 120_000)])

    waiting = [
        cand(f"w{i}", e, e + rng.randint(0, 512)) for i, e in enumerate(size() for _ in range(rng.randint(0, 12)))
    ]
    continuing = [cand("chunked", size(), 0)] if rng.random() < 0.5 else []
    return snap(
        waiting,
        free_kv=rng.randint(0, 250_000),
        slots=rng.randint(0, 8),
        continuing=continuing,
        granule_tokens=rng.choice([1, 16, 64]),
    )


def test_fcfs_switch_reproduces_upstream_decisions_exactly():
    rng = random.Random(7)
    for budget in (2048, 4096, 8192):
        planner = PassPlanner(PolicyConfig(**FCFS, chunk_budget_tokens=budget))
        for _ in range(2000):
            s = random_snapshot(rng)
            got = [(g.rid, g.tokens) for g in planner.plan(s).grants]
            assert got == upstream_reference(s, budget), s
