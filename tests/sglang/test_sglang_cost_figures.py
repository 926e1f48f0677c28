"""The decoding streams' contexts (`QueueSnapshot.decode_ctx_tokens`, a tensor sum in sglang) are read only where a
figure depends on them: a fresh plan whose pass-cost model predicts, and the pass trace. Skipping the read changes
no decision: before the online fit's first fit the model answers NaN whatever the figures."""

from __future__ import annotations

from unittest import mock

from harness.sglang_classes import EngineSpec, Harness, ReqSpec
from scheduler.pass_cost_fit import PRIOR
from scheduler.sglang_plugin.adder import PassRun
from scheduler.sglang_plugin.translate import decode_ctx_tokens

ENGINE = EngineSpec(pool_tokens=6000, chunk_tokens=512, max_running=8, mixed_chunk=True)
REQS = [
    ReqSpec("stream-a", 300, max_new_tokens=64, decode_passes=40),
    ReqSpec("stream-b", 200, max_new_tokens=64, arrive_pass=1, decode_passes=40),
    *(ReqSpec(f"q{i}", 40 + 30 * i, max_new_tokens=16, arrive_pass=2 + 2 * i, decode_passes=3) for i in range(6)),
    ReqSpec("doc", 1500, max_new_tokens=16, arrive_pass=4, decode_passes=2),
]


def planned(h: Harness, passes: int) -> list[tuple[int, int, object]]:
    """Each plan made: (pass, the snapshot's decode contexts, the running batch's as sglang holds them, the plan)."""
    seen: list[tuple[int, int, object]] = []
    plan = h.policy.planner.plan

    def recording(snap):
        result = plan(snap)
        seen.append((h.pass_index, snap.decode_ctx_tokens, decode_ctx_tokens(h.running), result))
        return result

    with mock.patch.object(h.policy.planner, "plan", recording):
        h.run(passes)
    return seen


def test_contexts_are_read_for_a_model_that_predicts():
    h = Harness(ENGINE, REQS)
    h.policy.planner.pass_cost = PRIOR
    seen = planned(h, 20)
    assert any(read for _, read, _, _ in seen), "no pass planned while streams decoded"
    assert all(read == actual for _, read, actual, _ in seen)


def test_an_unfitted_model_plans_the_same_without_reading_them():
    lazy = Harness(ENGINE, REQS)
    assert not lazy.policy.pass_cost.predicts
    lazy_seen = planned(lazy, 20)
    eager = Harness(ENGINE, REQS)
    with mock.patch.object(PassRun, "_cost_predicts", True):
        eager_seen = planned(eager, 20)
    assert all(read == 0 for _, read, _, _ in lazy_seen)
    assert any(read > 0 for _, read, _, _ in eager_seen)
    assert [(i, p) for i, _, _, p in lazy_seen] == [(i, p) for i, _, _, p in eager_seen]
    assert lazy.history == eager.history
