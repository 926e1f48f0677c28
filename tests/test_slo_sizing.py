"""SLO-driven pass sizing (`scheduler.slo_sizing`): each pass is the largest the engine's pass-cost model predicts
keeps the interactive targets; short requests short of running slots get passes at the floor; a target the
hardware cannot meet and a model that cannot predict are reported, never ignored."""

from __future__ import annotations

import logging
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.pass_cost import chunk_ctx_pairs
from scheduler.pass_cost_fit import LinearPassCost
from scheduler.planner import PassPlanner
from scheduler.sim.cost_model import CostModel
from scheduler.sim.presets import H100_8B
from scheduler.slo_sizing import throughput_knee
from scheduler.snapshot import Candidate, QueueSnapshot
from tests.factories import cand, cfg, snap
from tests.hypothesis_budget import examples
from tests.test_attention_work import PaddedCost

H100 = H100_8B.cost
CPU_FIT = LinearPassCost(
    fixed_s=0.0065, prefill_token_s=4.8e-5, prefill_pair_s=2.2e-8, decode_row_s=7e-4, decode_ctx_token_s=7e-7
)
"""A CPU engine's fitted costs (scheduler.pass_cost_fit on the peer benchmark's engines): 6.5 ms a pass."""


def doc(rid: str = "doc", left: int = 100_000, ctx: int = 0) -> Candidate:
    return Candidate(rid, left, 0, ctx)


def predicted(cost: CostModel, tokens: int, ctx: int, rows: int = 0, rows_ctx: int = 0) -> float:
    return cost.pass_s(tokens, chunk_ctx_pairs(ctx, tokens), rows, rows_ctx)


def test_while_chats_decode_a_pass_is_the_largest_within_the_tbt_target():
    planner = PassPlanner(cfg(tbt_target_s=0.3, ttft_target_s=2.0), pass_cost=H100)
    plan = planner.plan(
        snap([], continuing=[doc(ctx=50_000)], num_decoding=4, num_short_decoding=4, decode_ctx_tokens=1_000)
    )
    tokens = plan.pass_budget_tokens
    assert plan.sized_by == "tbt" and plan.pass_bound_s == 0.3
    assert predicted(H100, tokens, 50_000, 4, 1_000) <= 0.3 < predicted(H100, tokens + 1, 50_000, 4, 1_000)
    assert plan.predicted_pass_s == pytest.approx(predicted(H100, tokens, 50_000, 4, 1_000))


def test_a_delivery_margin_plans_every_pass_as_the_targets_less_it_would():
    """The margin is what the path to the client takes of each target: the passes are those of targets less it."""
    situation = snap([], continuing=[doc(ctx=50_000)], num_decoding=4, num_short_decoding=4, decode_ctx_tokens=1_000)
    margin = PassPlanner(cfg(tbt_target_s=0.3, ttft_target_s=2.0, delivery_margin_s=0.01), pass_cost=H100)
    tighter = PassPlanner(cfg(tbt_target_s=0.29, ttft_target_s=1.99), pass_cost=H100)
    with_margin, with_tighter = margin.plan(situation), tighter.plan(situation)
    assert with_margin.pass_budget_tokens == with_tighter.pass_budget_tokens
    assert with_margin.pass_bound_s == pytest.approx(0.29) and with_margin.sized_by == "tbt"
    chat = snap([cand("q", 40)], continuing=[doc(ctx=50_000)])
    assert margin.plan(chat).pass_bound_s == pytest.approx(tighter.plan(chat).pass_bound_s)


def test_a_delivery_margin_must_leave_something_of_each_target():
    with pytest.raises(ValueError, match="delivery_margin_s"):
        cfg(tbt_target_s=0.3, delivery_margin_s=0.3)


def test_the_context_a_document_has_reached_shrinks_its_passes():
    def tokens_at(ctx: int) -> int:
        planner = PassPlanner(cfg(), pass_cost=H100)
        plan = planner.plan(snap([], continuing=[doc(ctx=ctx)], num_decoding=1, num_short_decoding=1))
        return plan.pass_budget_tokens

    assert tokens_at(0) > tokens_at(20_000) > tokens_at(100_000)


def test_a_pass_planned_with_no_chat_around_leaves_room_for_one_arriving_during_it():
    c = cfg(ttft_target_s=0.5)
    planner = PassPlanner(c, pass_cost=H100)
    plan = planner.plan(snap([], continuing=[doc(ctx=80_000)]))
    own = predicted(H100, 256, 0)  # the reserve before any chat: a 256-token prompt
    assert plan.sized_by == "ttft"
    assert plan.pass_bound_s == pytest.approx(0.5 - own)
    assert plan.predicted_pass_s <= 0.5 - own


def test_the_pass_that_admits_a_chat_gets_what_the_pass_before_left_of_its_ttft():
    planner = PassPlanner(cfg(ttft_target_s=0.5, tbt_target_s=1.0), pass_cost=H100)
    before = planner.plan(snap([], continuing=[doc(ctx=80_000)]))
    plan = planner.plan(snap([cand("q", 200)], continuing=[doc(ctx=82_000)]))
    assert plan.sized_by == "admit"
    assert plan.pass_bound_s == pytest.approx(0.5 - before.predicted_pass_s)
    assert before.predicted_pass_s + plan.predicted_pass_s <= 0.5
    assert {g.rid for g in plan.grants} == {"q", "doc"}


def test_a_capped_chat_pass_carries_no_more_document_than_the_cap_and_the_next_pass_is_unchanged():
    """`admit_pass_long_tokens`: the chat's own pass is short whatever its bounds allow, and documents go on in the
    next pass, sized as without the cap. A CPU engine's passes near their best rate (the CPU config's policy) leave
    a chat's own pass room for hundreds of document tokens."""

    def passes(cap: int | None) -> tuple[object, object]:
        knobs = dict(ttft_target_s=0.5, chunk_budget_tokens=2048, pass_throughput_slack=0.02)
        planner = PassPlanner(cfg(admit_pass_long_tokens=cap, **knobs), pass_cost=CPU_FIT)
        planner.plan(snap([], continuing=[doc(ctx=12_000)]))
        admit = planner.plan(snap([cand("q", 200)], continuing=[doc(ctx=12_500)]))
        return admit, planner.plan(snap([], continuing=[doc(ctx=13_000)]))

    (free, free_next), (none, none_next), (some, some_next) = passes(None), passes(0), passes(64)
    assert free.sized_by == "throughput" and sum(g.tokens for g in free.grants if g.rid == "doc") > 64
    assert none.sized_by == "admit_cap" and [(g.rid, g.tokens) for g in none.grants] == [("q", 200)]
    assert none.predicted_pass_s < free.predicted_pass_s
    assert some.sized_by == "admit_cap" and sum(g.tokens for g in some.grants if g.rid == "doc") == 64
    assert none_next.pass_budget_tokens == some_next.pass_budget_tokens == free_next.pass_budget_tokens
    assert none_next.sized_by == free_next.sized_by == "throughput"


def test_an_engine_that_plans_a_pass_ahead_halves_the_pass_in_flight():
    def bound(lag: int) -> float:
        planner = PassPlanner(cfg(ttft_target_s=0.5), pass_cost=H100)
        return planner.plan(snap([], continuing=[doc(ctx=80_000)], admission_lag_passes=lag)).pass_bound_s

    assert bound(1) == pytest.approx(bound(0) / 2)


def test_an_engine_that_sends_first_tokens_a_pass_late_keeps_that_pass_minimal():
    # sglang's overlap loop on CPU: planned a pass ahead, and a pass's first tokens leave once the next has run.
    def planner_after_a_pass(out: int) -> tuple[PassPlanner, object, dict]:
        planner = PassPlanner(cfg(ttft_target_s=0.5, tbt_target_s=1.0), pass_cost=H100)
        lags = dict(admission_lag_passes=1, output_lag_passes=out)
        return planner, planner.plan(snap([], continuing=[doc(ctx=80_000)], **lags)), lags

    quiet = {}
    for out in (0, 1):
        planner, _, lags = planner_after_a_pass(out)
        quiet[out] = planner.plan(snap([], continuing=[doc(ctx=82_000)], **lags)).pass_bound_s
    own = 2 * (quiet[0] - quiet[1])  # every pass leaves room for one more pass as short as a chat's own
    assert 0 < own < 0.05
    # A chat that arrived during `before` waited for it and the pass planned ahead; the pass that admits it gets
    # what that left, less the pass after it ...
    planner, before, lags = planner_after_a_pass(1)
    admit = planner.plan(snap([cand("q", 200)], continuing=[doc(ctx=82_000)], **lags))
    assert admit.sized_by == "admit"
    assert admit.pass_bound_s == pytest.approx(0.5 - 2 * before.predicted_pass_s - own, rel=1e-6)
    # ... which its first token waits for: the minimal pass, the documents' floor.
    after = planner.plan(snap([], continuing=[doc(ctx=84_000)], **lags))
    assert (after.sized_by, after.pass_budget_tokens) == ("output", cfg().long_pass_floor_tokens)
    assert planner.plan(snap([], continuing=[doc(ctx=84_200)], **lags)).sized_by == "ttft"
    # A GPU sends them while the next pass runs: no such pass.
    planner, _, lags = planner_after_a_pass(0)
    planner.plan(snap([cand("q", 200)], continuing=[doc(ctx=82_000)], **lags))
    assert planner.plan(snap([], continuing=[doc(ctx=84_000)], **lags)).sized_by == "ttft"


def test_the_chunk_budget_bounds_a_pass_every_target_allows():
    planner = PassPlanner(cfg(ttft_target_s=60.0, tbt_target_s=60.0), pass_cost=H100)
    plan = planner.plan(snap([], continuing=[doc()]))
    assert plan.sized_by == "chunk" and plan.pass_budget_tokens == 8192


def test_a_short_request_waiting_for_a_slot_while_streams_decode_gets_passes_without_long_prefill():
    planner = PassPlanner(cfg(max_running_requests=8), pass_cost=H100)
    waiting = snap([cand("q", 30)], slots=0, continuing=[doc()], num_decoding=7, num_short_decoding=6)
    plan = planner.plan(waiting)
    # No document prefill but the documents' floor (they keep moving under chat overload).
    assert plan.sized_by == "slots" and plan.pass_budget_tokens == cfg().long_pass_floor_tokens
    assert planner.slo_counters.slot_passes == 1
    # Streams that hold more than the interactive reserve (1 slot here) and leave no more than it free: the
    # next arrival may find none, so passes shrink before anyone waits.
    low = planner.plan(snap([], slots=1, continuing=[doc()], num_decoding=6, num_short_decoding=6))
    assert low.sized_by == "slots"
    # Long requests hold the slots and the short streams only their reserve: small passes would only delay the
    # documents' slots. The static knobs follow the same rule.
    assert planner.plan(snap([cand("q", 30)], slots=0, continuing=[doc()])).sized_by != "slots"
    held = snap([cand("q", 30)], slots=0, continuing=[doc()], num_decoding=4, num_short_decoding=1)
    assert planner.plan(held).sized_by != "slots"
    static = PassPlanner(cfg(max_running_requests=8, slo_sizing=False))
    assert static.plan(waiting).pass_budget_tokens == cfg().long_pass_floor_tokens
    floorless = PassPlanner(cfg(max_running_requests=8, long_pass_floor_tokens=0), pass_cost=H100)
    assert floorless.plan(waiting).pass_budget_tokens == 1  # never below one token


def test_a_target_no_pass_can_keep_is_counted_logged_once_and_gets_the_minimal_pass(caplog):
    # One H100 pass costs 12 ms fixed: a 1 ms TBT target cannot be kept. The pass comes as close as it can while the
    # document keeps its floor.
    knobs = dict(tbt_target_s=0.001, long_pass_floor_tokens=100, missed_pass_stretch=1.0)
    planner = PassPlanner(cfg(**knobs), pass_cost=H100)
    decoding = snap([], continuing=[doc()], num_decoding=2, num_short_decoding=2)
    with caplog.at_level(logging.WARNING, logger="fairshare.scheduler"):
        plans = [planner.plan(decoding) for _ in range(3)]
    assert all(p.missed_targets == ("tbt",) and p.pass_budget_tokens == 100 for p in plans)
    assert planner.slo_counters.missed_passes["tbt"] == 3
    (line,) = caplog.messages
    assert "the tbt target 0.001 s cannot be met" in line


def test_a_pass_no_size_keeps_in_target_stretches_the_documents_share_by_what_the_floor_costs():
    """Padded attention 12k tokens into a document (sglang's torch_native on CPU): the document's presence costs
    the causal square whatever its chunk, so the floor's 128 tokens cost most of the pass; no size keeps a 0.1 s
    bound. The pass may spend twice what the floor costs it on the document: thousands of tokens, not 128."""
    deep = snap([], continuing=[doc(ctx=12_000)], num_decoding=2, num_short_decoding=2)
    knobs = dict(chunk_budget_tokens=8192, interactive_pass_tokens=512, ttft_target_s=0.1, tbt_target_s=0.1)
    floor = PassPlanner(cfg(**knobs, missed_pass_stretch=1.0), pass_cost=PaddedCost()).plan(deep)
    stretched = PassPlanner(cfg(**knobs), pass_cost=PaddedCost()).plan(deep)
    assert floor.missed_targets and floor.pass_budget_tokens == 128
    assert stretched.missed_targets and 2048 <= stretched.pass_budget_tokens < 8192 - 2
    assert stretched.predicted_pass_s <= 2 * floor.predicted_pass_s
    # With linear costs (H100) the floor costs the pass little, and so does the stretch: a few more tokens.
    decoding = snap([], continuing=[doc()], num_decoding=2, num_short_decoding=2)
    linear = PassPlanner(cfg(tbt_target_s=0.001), pass_cost=H100).plan(decoding)
    assert linear.missed_targets and 128 < linear.pass_budget_tokens <= 2 * 128 + 2


class Raising:
    def pass_s(self, *args: object) -> float:
        raise RuntimeError("no data yet")


class Answering:
    def __init__(self, seconds: object) -> None:
        self.seconds = seconds

    def pass_s(self, *args: object) -> object:
        return self.seconds


@pytest.mark.parametrize("model", [Raising(), Answering(math.nan), Answering(-1.0), Answering(math.inf)])
def test_a_model_that_cannot_predict_leaves_the_pass_to_the_static_knobs(model, caplog):
    static = PassPlanner(cfg(slo_sizing=False))
    planner = PassPlanner(cfg(), pass_cost=model)
    situations = [
        snap([], continuing=[doc()]),
        snap([cand("q", 100)], continuing=[doc()], num_decoding=2, num_short_decoding=1),
        snap([], continuing=[doc()], num_decoding=2, num_short_decoding=1),
    ]
    with caplog.at_level(logging.WARNING, logger="fairshare.scheduler"):
        for s in situations:
            ours, theirs = planner.plan(s), static.plan(s)
            assert (ours.pass_budget_tokens, ours.grants) == (theirs.pass_budget_tokens, theirs.grants)
            assert ours.predicted_pass_s is None and ours.sized_by == "static"
    assert planner.slo_counters.unusable_cost_passes == 3
    assert len(caplog.messages) == 1 and "static pass knobs" in caplog.messages[0]


def test_a_model_that_predicts_nothing_costs_anything_allows_the_chunk_budget():
    planner = PassPlanner(cfg(), pass_cost=Answering(0.0))
    assert planner.plan(snap([], continuing=[doc()], num_decoding=3, num_short_decoding=3)).pass_budget_tokens == 8189


def test_with_slo_sizing_off_or_adaptive_passes_off_the_old_knobs_decide():
    s = snap([], continuing=[doc()], num_decoding=1, num_short_decoding=1)
    assert PassPlanner(cfg(slo_sizing=False), pass_cost=H100).plan(s).pass_budget_tokens == 512
    assert PassPlanner(cfg(adaptive_pass=False), pass_cost=H100).plan(s).pass_budget_tokens == 8191


class Stating:
    """A model that states its relative error (as the online fit does)."""

    def __init__(self, cost: CostModel, error: object) -> None:
        self.cost, self.relative_error = cost, error

    def pass_s(self, *figures: float) -> float:
        return self.cost.pass_s(*figures)


def test_a_model_that_states_its_error_is_charged_with_it_against_every_bound():
    deep = snap([], continuing=[doc(ctx=50_000)], num_decoding=4, num_short_decoding=4, decode_ctx_tokens=1_000)
    exact = PassPlanner(cfg(tbt_target_s=0.3, ttft_target_s=2.0), pass_cost=H100).plan(deep)
    plan = PassPlanner(cfg(tbt_target_s=0.3, ttft_target_s=2.0), pass_cost=Stating(H100, 0.2)).plan(deep)
    tokens = plan.pass_budget_tokens
    # The bound is still the target; the pass is the largest whose prediction, 20% over, keeps it.
    assert plan.sized_by == exact.sized_by == "tbt" and plan.pass_bound_s == exact.pass_bound_s == 0.3
    assert 1.2 * predicted(H100, tokens, 50_000, 4, 1_000) <= 0.3 < 1.2 * predicted(H100, tokens + 1, 50_000, 4, 1_000)
    assert plan.predicted_pass_s == pytest.approx(predicted(H100, tokens, 50_000, 4, 1_000))  # as the model says
    assert tokens < exact.pass_budget_tokens
    # Room for a chat arriving during the pass: its own pass is charged too.
    quiet = PassPlanner(cfg(ttft_target_s=0.5), pass_cost=Stating(H100, 0.2)).plan(snap([], continuing=[doc()]))
    assert quiet.pass_bound_s == pytest.approx(0.5 - 1.2 * predicted(H100, 256, 0))
    assert 1.2 * quiet.predicted_pass_s <= quiet.pass_bound_s
    # The pass that admits a chat: the pass it waited through is charged too.
    planner = PassPlanner(cfg(ttft_target_s=0.5, tbt_target_s=1.0), pass_cost=Stating(H100, 0.2))
    before = planner.plan(snap([], continuing=[doc(ctx=80_000)]))
    admit = planner.plan(snap([cand("q", 200)], continuing=[doc(ctx=82_000)]))
    assert admit.sized_by == "admit" and admit.pass_bound_s == pytest.approx(0.5 - 1.2 * before.predicted_pass_s)


def test_a_model_stating_no_error_plans_exactly_as_one_that_states_none():
    s = snap([cand("q", 300)], continuing=[doc(ctx=30_000)], num_decoding=3, num_short_decoding=2)
    a = PassPlanner(cfg(), pass_cost=H100).plan(s)
    b = PassPlanner(cfg(), pass_cost=Stating(H100, 0)).plan(s)
    assert (a.pass_budget_tokens, a.pass_bound_s, a.predicted_pass_s) == (
        b.pass_budget_tokens,
        b.pass_bound_s,
        b.predicted_pass_s,
    )


class RaisingError:
    @property
    def relative_error(self) -> float:
        raise RuntimeError("window empty")

    def pass_s(self, *figures: float) -> float:
        return H100.pass_s(*figures)


@pytest.mark.parametrize("error", [math.nan, -0.1, math.inf, True, "15%", "raises"])
def test_a_model_stating_an_error_that_is_not_a_finite_non_negative_number_leaves_the_pass_to_the_static_knobs(
    error, caplog
):
    model = RaisingError() if error == "raises" else Stating(H100, error)
    s = snap([], continuing=[doc()], num_decoding=2, num_short_decoding=1)
    with caplog.at_level(logging.WARNING, logger="fairshare.scheduler"):
        ours = PassPlanner(cfg(), pass_cost=model).plan(s)
    theirs = PassPlanner(cfg(slo_sizing=False)).plan(s)
    assert ours.sized_by == "static" and ours.pass_budget_tokens == theirs.pass_budget_tokens
    assert "error" in caplog.messages[0] and "static pass knobs" in caplog.messages[0]


def test_the_ttft_reserve_is_the_99th_percentile_of_recent_chat_prompts():
    planner = PassPlanner(cfg(), pass_cost=H100)
    for i in range(100):
        planner.plan(snap([cand(f"q{i}", 1000 if i == 7 else 100)], continuing=[doc()]))
    assert planner.sizer.slo.chat_prompts.reserve_tokens == 100  # one 1,000-token prompt in 100 is the 1%
    planner.plan(snap([cand("big", 1000)], continuing=[doc()]))
    assert planner.sizer.slo.chat_prompts.reserve_tokens == 1000


COSTS = st.builds(
    CostModel,
    name=st.just("random"),
    fixed_s=st.floats(0.0, 0.3),
    prefill_tok_per_s=st.floats(500.0, 50_000.0),
    decode_row_s=st.floats(0.0, 1e-3),
    attn_s_per_token_ctx=st.floats(0.0, 1e-8),
    overlap_p=st.floats(1.0, 3.0),
    kv_pool_tokens=st.just(1_000_000),
)


@st.composite
def situations(draw) -> QueueSnapshot:
    longs = [Candidate("doc", draw(st.integers(1, 200_000)), 0, draw(st.integers(0, 200_000)))]
    if draw(st.booleans()):
        longs.append(Candidate("doc2", draw(st.integers(2049, 100_000)), draw(st.integers(2049, 110_000)), 0))
    shorts = [Candidate(f"q{i}", n, n + 64, 0) for i, n in enumerate(draw(st.lists(st.integers(1, 2048), max_size=3)))]
    decoding = draw(st.integers(0, 64))
    return QueueSnapshot(
        waiting=[*longs[1:], *shorts],
        free_kv_tokens=10**7,
        free_running_slots=draw(st.integers(0, 8)),
        continuing=longs[:1],
        num_decoding=decoding,
        num_short_decoding=draw(st.integers(0, decoding)),
        decode_ctx_tokens=decoding * draw(st.integers(0, 4000)),
        granule_tokens=draw(st.sampled_from([1, 16, 64])),
        admission_lag_passes=draw(st.integers(0, 1)),
        output_lag_passes=draw(st.integers(0, 1)),
    )


TARGETS_S = st.floats(0.001, 5.0)


def _planned(cost: CostModel, snapshot: QueueSnapshot, **knobs: object):
    planner = PassPlanner(cfg(chunk_budget_tokens=4096, max_running_requests=16, **knobs), pass_cost=cost)
    return planner.plan(snapshot)


@settings(max_examples=examples(300), deadline=None, derandomize=True)
@given(COSTS, situations(), TARGETS_S, TARGETS_S, TARGETS_S)
def test_passes_grow_with_the_targets_never_above_the_chunk_budget(cost, snapshot, ttft_s, tbt_s, more_s):
    """Monotone in the targets, with or without the throughput knee. The one exception is by design
    (`missed_pass_stretch`): a pass no size keeps in target may take the chunk where that costs little more than
    the minimal pass, so across the edge of what the hardware can keep a tighter target can plan more; with the
    stretch off the controller is monotone throughout, and with it on wherever the tighter target can be kept."""
    for stretch, slack in ((1.0, None), (2.0, None), (1.0, 0.05), (2.0, 0.05)):
        knobs = dict(missed_pass_stretch=stretch, pass_throughput_slack=slack)
        plan = _planned(cost, snapshot, ttft_target_s=ttft_s, tbt_target_s=tbt_s, **knobs)
        looser_ttft = _planned(cost, snapshot, ttft_target_s=ttft_s + more_s, tbt_target_s=tbt_s, **knobs)
        looser_tbt = _planned(cost, snapshot, ttft_target_s=ttft_s, tbt_target_s=tbt_s + more_s, **knobs)
        for p in (plan, looser_ttft, looser_tbt):
            assert 1 <= p.pass_budget_tokens <= 4096 and p.num_prefill_tokens <= p.pass_budget_tokens
        if stretch == 1.0 or not plan.missed_targets:
            assert plan.pass_budget_tokens <= min(looser_ttft.pass_budget_tokens, looser_tbt.pass_budget_tokens)
    # What the targets allowed is what the model predicts for the pass as planned, unless no pass could keep them.
    if plan.predicted_pass_s is not None and not plan.missed_targets and plan.sized_by != "slots":
        assert plan.predicted_pass_s <= plan.pass_bound_s * (1 + 1e-9)


@settings(max_examples=examples(100), deadline=None, derandomize=True)
@given(situations(), st.sampled_from([0.0, math.nan, -1.0, math.inf, None]))
def test_any_answer_from_a_model_with_no_data_yet_plans_within_the_chunk_budget(snapshot, seconds):
    plan = _planned(Raising() if seconds is None else Answering(seconds), snapshot)
    assert 1 <= plan.pass_budget_tokens <= 4096 and plan.num_prefill_tokens <= plan.pass_budget_tokens


@settings(max_examples=examples(300), deadline=None, derandomize=True)
@given(COSTS, situations(), TARGETS_S, TARGETS_S, st.integers(0, 512))
def test_a_pass_that_admits_short_requests_carries_at_most_the_cap_of_long_tokens(cost, snapshot, ttft_s, tbt_s, cap):
    """Whatever the targets and the model: with `admit_pass_long_tokens`, a pass that admits a short request grants
    the documents at most the cap; a pass that admits none is planned exactly as without it."""
    for slack in (None, 0.05):
        knobs = dict(ttft_target_s=ttft_s, tbt_target_s=tbt_s, pass_throughput_slack=slack)
        free = _planned(cost, snapshot, **knobs)
        capped = _planned(cost, snapshot, admit_pass_long_tokens=cap, **knobs)
        long_tokens = sum(g.tokens for g in capped.grants if g.rid.startswith("doc"))
        if any(g.rid.startswith("q") for g in capped.grants):
            assert long_tokens <= cap
            assert capped.pass_budget_tokens <= free.pass_budget_tokens
        else:
            assert capped == free


ERRORS = st.floats(0.0, 2.0)


@settings(max_examples=examples(300), deadline=None, derandomize=True)
@given(COSTS, situations(), TARGETS_S, TARGETS_S, ERRORS, ERRORS)
def test_a_larger_stated_error_never_plans_a_bigger_pass(cost, snapshot, ttft_s, tbt_s, error, more):
    """The same exception as the targets' (`missed_pass_stretch`): where the larger error puts the targets out of
    reach the stretched minimal pass may be bigger; with the stretch off, never."""
    for stretch, slack in ((1.0, None), (2.0, None), (1.0, 0.05), (2.0, 0.05)):
        knobs = dict(ttft_target_s=ttft_s, tbt_target_s=tbt_s, missed_pass_stretch=stretch, pass_throughput_slack=slack)
        plan = _planned(Stating(cost, error), snapshot, **knobs)
        wider = _planned(Stating(cost, error + more), snapshot, **knobs)
        for p in (plan, wider):
            assert 1 <= p.pass_budget_tokens <= 4096 and p.num_prefill_tokens <= p.pass_budget_tokens
        if stretch == 1.0 or not wider.missed_targets:
            assert wider.pass_budget_tokens <= plan.pass_budget_tokens
    # The pass as planned, charged with the error, is within the bound, unless no pass could keep it.
    if wider.predicted_pass_s is not None and not wider.missed_targets and wider.sized_by != "slots":
        assert (1 + error + more) * wider.predicted_pass_s <= wider.pass_bound_s * (1 + 1e-9)


def linear_seconds(fixed_s: float, token_s: float, pair_s: float, ctx: int):
    return lambda n: fixed_s + token_s * n + pair_s * chunk_ctx_pairs(ctx, n)


def prefill_s(
    fixed_s: float, token_s: float, pair_s: float, overhead_s: float, sizes: list[int], ctx: int = 0
) -> float:
    """Seconds to prefill a document in passes of `sizes` tokens from `ctx`, each attending to its prefix."""
    total = 0.0
    for n in sizes:
        total += linear_seconds(fixed_s, token_s, pair_s, ctx)(n) + overhead_s
        ctx += n
    return total


LINEAR_MODELS = dict(
    fixed_s=st.floats(1e-4, 0.1),
    token_s=st.floats(0.0, 1e-3),
    pair_s=st.floats(0.0, 1e-7),
    overhead_s=st.floats(0.0, 0.05),
    slack=st.floats(0.0, 0.5),
)
"""A linear pass-cost model (`linear_seconds`), the loop's time between passes and a slack."""


@settings(max_examples=examples(200), deadline=None, derandomize=True)
@given(**LINEAR_MODELS, document=st.integers(1, 40_000), bound=st.integers(1, 4096))
def test_a_document_in_knee_sized_passes_loses_at_most_the_slack(
    fixed_s, token_s, pair_s, overhead_s, document, bound, slack
):
    """The knob's promise: a whole document prefilled in passes each sized at its depth by the knee (the planner
    sizes a pass against its bound; the document's last pass carries what is left) takes at most `1 + slack` times
    as long as in passes of the bound, plus one pass's fixed part: that last pass's fragment."""
    sizes, ctx = [], 0
    while ctx < document:
        n = throughput_knee(slack, 0, bound, linear_seconds(fixed_s, token_s, pair_s, ctx), overhead_s)
        assert n >= 1
        sizes.append(min(n, document - ctx))
        ctx += sizes[-1]
    largest = [min(bound, document - c) for c in range(0, document, bound)]
    knee_s = prefill_s(fixed_s, token_s, pair_s, overhead_s, sizes)
    largest_s = prefill_s(fixed_s, token_s, pair_s, overhead_s, largest)
    assert knee_s <= ((1 + slack) * largest_s + fixed_s + overhead_s) * (1 + 1e-9)


@settings(max_examples=examples(200), deadline=None, derandomize=True)
@given(
    **LINEAR_MODELS,
    ctx=st.integers(0, 100_000),
    floor=st.integers(0, 256),
    tokens=st.integers(0, 1500),
    more=st.integers(0, 1500),
    more_s=st.floats(0.0, 0.05),
)
def test_the_throughput_knee_is_the_fewest_tokens_within_the_slack_and_monotone(
    fixed_s, token_s, pair_s, ctx, floor, tokens, more, slack, overhead_s, more_s
):
    """`tokens` split into passes of the knee pay the fixed part `tokens / knee` times: at most the slack of what
    they cost in one pass of `tokens`, each token priced at this depth; one token fewer would pay more."""
    seconds = linear_seconds(fixed_s, token_s, pair_s, ctx)
    knee = throughput_knee(slack, floor, tokens, seconds, overhead_s)
    lo = max(floor, 1)
    if tokens <= lo:
        assert knee == tokens
        return
    assert lo <= knee <= tokens
    fixed = fixed_s - pair_s + overhead_s  # a pass of one token, less the second token's cost (ctx + 2 pairs)
    token = token_s + pair_s * (ctx + 2)

    def loss(n: int) -> float:
        return (tokens / n - 1) * fixed - slack * (fixed + tokens * token)

    assert loss(knee) <= 1e-9 * fixed
    assert knee == lo or loss(knee - 1) > -1e-9 * fixed  # none fewer keeps the slack
    assert throughput_knee(slack, floor, tokens + more, seconds, overhead_s) >= knee  # the targets stay monotone
    assert throughput_knee(slack, floor, tokens, seconds, overhead_s + more_s) >= knee  # the loop's time only adds


def test_a_cpu_engine_deep_in_a_document_plans_passes_short_of_its_largest_within_the_slack():
    snapshot = snap([], continuing=[doc(ctx=12_000)])
    largest = PassPlanner(cfg(ttft_target_s=0.5, chunk_budget_tokens=2048), pass_cost=CPU_FIT).plan(snapshot)
    knee = PassPlanner(
        cfg(ttft_target_s=0.5, chunk_budget_tokens=2048, pass_throughput_slack=0.02), pass_cost=CPU_FIT
    ).plan(snapshot)
    assert largest.sized_by == "ttft" and knee.sized_by == "throughput"
    n, most = knee.pass_budget_tokens, largest.pass_budget_tokens
    assert n < most * 0.75

    def document_s(size: int) -> float:  # the document's 100k tokens left, each pass `size` at most
        sizes = [min(size, 100_000 - c) for c in range(0, 100_000, size)]
        return prefill_s(CPU_FIT.fixed_s, CPU_FIT.prefill_token_s, CPU_FIT.prefill_pair_s, 0.0, sizes, ctx=12_000)

    assert document_s(n) <= 1.02 * document_s(most)
