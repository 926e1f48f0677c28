"""`PassPlanner.replay_idle` is `plan` for a pass in which nothing can be admitted: pass by pass, a planner that
replays the first such plan decides, sizes and records exactly what a twin planner that walks the queue every
pass does, while free KV moves below what any judged request needs and the forward-pass counter runs past the
activity window and the reservation age."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.admission import free_kv_to_fit
from scheduler.config import PolicyConfig
from scheduler.planner import PassPlanner
from scheduler.snapshot import Grant, PassPlan
from tests.factories import cand, snap
from tests.hypothesis_budget import examples


def state(p: PassPlanner) -> tuple:
    slo = p.sizer.slo
    return dict(p.ledger.first_skipped), p.sizer.last_short_pass, p.num_skip_ahead, p.num_plans, slo.queued_s


CFG = st.builds(
    PolicyConfig,
    skip_ahead=st.booleans(),
    lookahead=st.sampled_from([0, 2, 16]),
    max_skipped_passes=st.sampled_from([1, 3, 256]),
    short_request_tokens=st.sampled_from([64, 2048]),
    adaptive_pass=st.booleans(),
    mixed_decode=st.booleans(),
    fair_share=st.booleans(),
    interactive_reserve=st.booleans(),
    chunk_budget_tokens=st.sampled_from([512, 8192]),
)
CANDS = st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 3000)), min_size=1, max_size=40)


@settings(max_examples=examples(150), deadline=None)
@given(
    cfg=CFG,
    raw=CANDS,
    slots=st.integers(0, 16),
    decoding=st.integers(0, 8),
    short_decoding=st.integers(0, 2),
    short_index=st.booleans(),
    last_short_pass=st.one_of(st.none(), st.integers(0, 20)),
    steps=st.lists(st.tuples(st.integers(1, 300), st.integers(0, 1000), st.booleans()), min_size=1, max_size=8),
)
def test_replay_is_the_walk_of_a_pass_that_admits_nobody(
    cfg, raw, slots, decoding, short_decoding, short_index, last_short_pass, steps
):
    waiting = [cand(f"r{i}", extend, extend + extra) for i, (extend, extra) in enumerate(raw)]
    shorts = [c for c in waiting if cfg.is_short(c.extend_tokens)] if short_index else None
    # Less free KV than the least any request needs to fit (the walk's own threshold): nobody fits.
    least = min(
        free_kv_to_fit(cfg, cfg.is_short(c.extend_tokens), c.need_tokens, slots, decoding == 0) for c in waiting
    )
    ceiling = min(least - 1, 100_000)
    if ceiling < 0:
        return  # even an empty pool would fit someone

    def at(pass_index: int, free_kv: int):
        return snap(
            waiting,
            free_kv=free_kv,
            slots=slots,
            num_decoding=decoding,
            num_short_decoding=short_decoding,
            waiting_short=shorts,
            pass_index=pass_index,
        )

    replaying, walking = PassPlanner(cfg), PassPlanner(cfg)
    # As an engine without diagnostics runs idle passes: replayed unstamped, then repeated while the plan holds.
    repeating = PassPlanner(cfg.model_copy(update={"diagnostics": False}))
    for p in (replaying, walking, repeating):
        p.sizer.last_short_pass = last_short_pass
    first = replaying.plan(at(20, ceiling))
    assert walking.plan(at(20, ceiling)) == first and first.grants == []
    assert repeating.plan(at(20, ceiling)) == first
    pass_index, last = 20, None
    for gap, below, forget in steps:
        pass_index += gap
        s = at(pass_index, max(0, ceiling - below))
        if forget and first.rejections:  # the engine dropped a request's ledger entry: the replay records it again
            for p in (replaying, walking, repeating):
                p.forget(first.rejections[0].rid)
        want = walking.plan(s)
        got = replaying.replay_idle(s, first)
        assert got == want
        assert state(replaying) == state(walking)
        if last is None or not repeating.repeat_idle(last, pass_index, decoding, short_decoding):
            last = repeating.replay_idle(s, first, restamp=False)
        assert (last.pass_budget_tokens, last.cap_tokens, last.grants) == (
            want.pass_budget_tokens,
            want.cap_tokens,
            want.grants,
        )
        assert last.rejections is first.rejections
        assert state(repeating) == state(walking)
        cheap = PassPlanner(cfg.model_copy(update={"diagnostics": False}))
        unstamped = cheap.replay_idle(s, first, restamp=False)
        assert unstamped.rejections is first.rejections  # nothing rebuilt per request
        assert [(r.rid, r.need_tokens, r.skipped) for r in unstamped.rejections] == [
            (r.rid, r.need_tokens, r.skipped) for r in want.rejections
        ]


def test_an_idle_plan_repeats_until_its_pass_budget_would_change():
    """Repeated while the pass sizer sizes the pass alike; the pass after the activity window of a short admission
    is sized afresh (the interactive pass ends), and nothing moves for the refused repeat."""
    cfg = PolicyConfig(diagnostics=False, adaptive_pass=True, quiet_pass_tokens=4096, chunk_budget_tokens=8192)
    waiting = [cand("doc", 70_689, 70_945)]
    planner = PassPlanner(cfg)
    planner.sizer.last_short_pass = 10
    first = planner.plan(snap(waiting, free_kv=8_000, pass_index=11))
    plan = planner.replay_idle(snap(waiting, free_kv=7_990, pass_index=12), first, restamp=False)
    assert plan.pass_budget_tokens == cfg.interactive_pass_tokens
    quiet = 10 + cfg.activity_window_passes + 1
    assert all(planner.repeat_idle(plan, i, 0, 0) for i in range(13, quiet))
    before = state(planner)
    assert not planner.repeat_idle(plan, quiet, 0, 0)
    assert state(planner) == before
    assert planner.replay_idle(snap(waiting, free_kv=7_980, pass_index=quiet), first).pass_budget_tokens == 4096
    diagnosing = PassPlanner(cfg.model_copy(update={"diagnostics": True}))  # diagnostics log every pass's rejections
    diagnosing.sizer.last_short_pass = 10
    assert not diagnosing.repeat_idle(plan, 13, 0, 0)


def test_replay_restamps_the_free_kv_each_rejection_saw():
    waiting = [cand("doc", 70_689, 70_945), cand("big", 9_000)]
    planner = PassPlanner()
    first = planner.plan(snap(waiting, free_kv=8_000, pass_index=1))
    later = planner.replay_idle(snap(waiting, free_kv=7_990, pass_index=2), first)
    assert [(r.rid, r.rem_total_tokens) for r in later.rejections] == [("doc", 7_990), ("big", 7_990)]
    assert [r.rem_total_tokens for r in first.rejections] == [8_000, 8_000]  # the replayed plan is not changed


def test_replay_refuses_a_pass_that_admitted_or_continues():
    planner = PassPlanner()
    with pytest.raises(ValueError, match="admitted nobody"):
        planner.replay_idle(snap([cand("a", 10)]), PassPlan(grants=[Grant("a", 10, False)]))
    with pytest.raises(ValueError, match="continues nobody"):
        planner.replay_idle(snap([], continuing=[cand("c", 100)]), PassPlan())
