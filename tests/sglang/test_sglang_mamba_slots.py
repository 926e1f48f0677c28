"""Hybrid (mamba) models: matching a waiting request may take a copy-on-write state slot
(`finalize_match_result_in_cache` allocates one for a request that holds none). Upstream's scan holds at
most one for a request it then passes over; skip-ahead must not hold one per request it examines (a pool
of a few slots would run dry: sglang asserts "Can not alloc mamba cache")."""

import torch
from sglang.srt.managers.schedule_batch import Req

from harness.sglang_classes import EngineSpec, Harness, ReqSpec


class SlotPool:
    """The mamba allocator's interface as sglang's scan and cleanup call it; counts what is held."""

    def __init__(self) -> None:
        self.next_id = 0
        self.held: set[int] = set()
        self.peak_unadmitted = 0

    def alloc(self, n: int) -> torch.Tensor:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        self.held.update(ids)
        return torch.tensor(ids)

    def free(self, idx: torch.Tensor) -> None:
        self.held.difference_update(idx.flatten().tolist())

    def alloc_group_begin(self, n: int) -> None:
        pass

    def alloc_group_end(self) -> None:
        pass


def test_skip_ahead_holds_at_most_one_state_slot_for_requests_it_passes_over(monkeypatch):
    pool_tokens = 4096
    reqs = [ReqSpec("holder", 2000, decode_passes=50), ReqSpec("big", 2500, arrive_pass=1)]
    reqs += [ReqSpec(f"big{i}", 2500, arrive_pass=1) for i in range(8)]
    reqs += [ReqSpec("small", 30, arrive_pass=1)]
    plugin = Harness(EngineSpec(pool_tokens=pool_tokens, chunk_tokens=2048, max_running=16), reqs)
    slots = SlotPool()
    plugin.sched.tree_cache.req_to_token_pool.mamba_allocator = slots
    running = set()
    match = Req.init_next_round_input

    def match_with_cow(req, tree_cache, *args, **kwargs):
        match(req, tree_cache, *args, **kwargs)
        if req.kv.mamba_pool_idx is None:  # the copy-on-write slot of a matched mamba state
            req.kv.mamba_pool_idx = slots.alloc(1)[0]
        unadmitted = len(slots.held) - len(running) - 1  # the request being matched may still be admitted
        slots.peak_unadmitted = max(slots.peak_unadmitted, unadmitted)

    monkeypatch.setattr(Req, "init_next_round_input", match_with_cow)
    plugin.step()
    running.update(rid for rid, _ in plugin.history[-1].admitted)
    plugin.step()
    assert plugin.history[-1].admitted == [("small", 30)]  # skip-ahead went past nine big requests
    assert len(plugin.policy.last_run.window.examined) == 10
    assert slots.peak_unadmitted <= 1
    assert len(slots.held) == 2  # holder and small; every passed-over request gave its slot back
