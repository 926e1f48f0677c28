"""Skip-ahead admission on sglang's real scan: a request rejected for KV capacity no longer ends it."""

import pytest

from harness.sglang_classes import EngineSpec, Harness, ReqSpec
from scheduler.sglang_plugin.attach import policy_config_for

# 4,096 KV tokens; "holder" keeps 2,000 of them for 50 passes, so "big" (2,500 + output) cannot fit.
POOL = EngineSpec(pool_tokens=4096, chunk_tokens=2048, max_running=16)


@pytest.fixture(autouse=True)
def _admission_only(monkeypatch):
    """Admission alone: every pass a prefill pass, no slots or KV held back (those have their own tests)."""
    monkeypatch.setenv("FAIRSHARE_SHORT_DECODE_INTERLEAVE", "false")
    monkeypatch.setenv("FAIRSHARE_INTERACTIVE_RESERVE", "false")


def admitted_rids(harness: Harness) -> list[str]:
    return [rid for record in harness.history for rid, _ in record.admitted]


def test_small_request_behind_a_big_rejected_one_is_admitted():
    reqs = [
        ReqSpec("holder", 2000, decode_passes=50),
        ReqSpec("big", 2500, arrive_pass=1),
        ReqSpec("small", 30, arrive_pass=1),
    ]
    upstream = Harness(POOL, reqs, patched=False)
    plugin = Harness(POOL, reqs)
    upstream.run(3)
    plugin.run(3)
    assert "small" not in admitted_rids(upstream)  # upstream breaks at "big"
    assert admitted_rids(plugin) == ["holder", "small"]
    assert [r.rid for r in plugin.sched.waiting_queue] == ["big"]  # still waiting, in its place
    assert not plugin.running.batch_is_full  # a converted rejection leaves admission open
    # In the last pass "big" was still rejected for capacity, and the scan went on past it.
    assert [(r.rid, r.skipped) for r in plugin.policy.last_run.plan.rejections] == [("big", True)]


def test_lookahead_bounds_the_requests_examined_after_a_rejection(monkeypatch):
    monkeypatch.setenv("FAIRSHARE_LOOKAHEAD", "2")
    # The "s" requests count as long: short ones past the lookahead are found through the plugin's index of
    # short waiting requests (test_sglang_short_index), which the lookahead does not bound.
    monkeypatch.setenv("FAIRSHARE_SHORT_REQUEST_TOKENS", "10")
    reqs = [ReqSpec("holder", 2000, decode_passes=50), ReqSpec("big", 2500, arrive_pass=1)]
    reqs += [ReqSpec(f"s{i}", 20, arrive_pass=1) for i in range(5)]
    plugin = Harness(POOL, reqs)
    plugin.run(2)
    assert plugin.history[1].admitted == [("s0", 20), ("s1", 20)]
    run = plugin.policy.last_run
    # Only the rejected request and the two after it were matched against the cache and judged.
    assert [r.rid for r in run.window.examined] == ["big", "s0", "s1"]
    assert plugin.req("s2").last_node is None  # never matched this pass
    plugin.run(1)
    assert [rid for rid, _ in plugin.history[2].admitted] == ["s2", "s3"]


def test_long_request_may_not_overtake_a_starving_one(monkeypatch):
    """After `max_skipped_passes` skips the big request holds a reservation: later long requests wait
    behind it, short ones still pass."""
    monkeypatch.setenv("FAIRSHARE_MAX_SKIPPED_PASSES", "2")
    monkeypatch.setenv("FAIRSHARE_SHORT_REQUEST_TOKENS", "100")
    reqs = [
        ReqSpec("holder", 2000, decode_passes=50),
        ReqSpec("big", 2500, arrive_pass=1),
        ReqSpec("long", 600, arrive_pass=4),
        ReqSpec("short", 50, arrive_pass=4),
    ]
    plugin = Harness(POOL, reqs)
    plugin.run(6)
    assert "long" not in admitted_rids(plugin)
    assert "short" in admitted_rids(plugin)
    assert plugin.policy.planner.ledger.is_reserved("big", plugin.policy.cfg, plugin.sched.forward_ct)

    monkeypatch.setenv("FAIRSHARE_MAX_SKIPPED_PASSES", "256")
    without_guard = Harness(POOL, reqs)
    without_guard.run(6)
    assert "long" in admitted_rids(without_guard)


@pytest.mark.parametrize("attr", ["enable_priority_scheduling"])
def test_skip_ahead_is_off_under_priority_scheduling(monkeypatch, attr):
    monkeypatch.setenv("FAIRSHARE_SKIP_AHEAD", "true")
    reqs = [
        ReqSpec("holder", 2000, decode_passes=50),
        ReqSpec("big", 2500, arrive_pass=1),
        ReqSpec("small", 30, arrive_pass=1),
    ]
    plugin = Harness(EngineSpec(pool_tokens=4096, chunk_tokens=2048, priority_scheduling=True), reqs)
    assert getattr(plugin.sched, attr)
    assert not plugin.policy.cfg.skip_ahead
    assert not policy_config_for(plugin.sched).skip_ahead
    assert not policy_config_for(plugin.sched).tenant_fairness  # nor may a tenant overtake a priority
    plugin.run(3)
    assert "small" not in admitted_rids(plugin)


def test_requests_examined_and_not_admitted_get_upstreams_cleanup():
    """The plan matched "big" and did not admit it: the mamba state `init_next_round_input` may stage is
    undone, as upstream does on a rejection."""
    reqs = [
        ReqSpec("holder", 2000, decode_passes=50),
        ReqSpec("big", 2500, arrive_pass=1),
        ReqSpec("s0", 20, arrive_pass=1),
    ]
    plugin = Harness(POOL, reqs)
    plugin.run(1)
    big = plugin.req("big")
    # What a mamba-capable tree's match stages on a request (copy-on-write source, clear flag).
    big.kv.mamba_cow_src_index = 7
    big.kv.mamba_needs_clear = True
    plugin.run(1)
    assert big.kv.mamba_cow_src_index is None
    assert big.kv.mamba_needs_clear is False


class _MambaAllocator:
    def __init__(self):
        self.freed = []

    def free(self, indices):
        self.freed.append(indices.tolist())


@pytest.mark.parametrize("in_session", [False, True])
def test_cleanup_frees_a_fresh_mamba_slot_but_not_a_session_one(in_session):
    from types import SimpleNamespace

    import torch

    from harness.sglang_classes import make_req
    from scheduler.sglang_plugin.adder import release_unadmitted

    spec = ReqSpec("r", 10)
    req = make_req(spec, {"r": spec})
    req.kv.mamba_pool_idx = torch.tensor(5)
    req.kv.mamba_cow_src_index = 3
    req.kv.mamba_needs_clear = True
    if in_session:
        req.session = object()
    allocator = _MambaAllocator()
    tree = SimpleNamespace(req_to_token_pool=SimpleNamespace(mamba_allocator=allocator))
    release_unadmitted(req, tree)
    release_unadmitted(req, tree)  # idempotent
    assert (req.kv.mamba_cow_src_index, req.kv.mamba_needs_clear) == (None, False)
    assert allocator.freed == ([] if in_session else [[5]])
    assert req.kv.holds_mamba == in_session
