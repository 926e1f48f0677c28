"""The SLO autoscaling decision (`serve_app.autoscaling.decision`), its signals and its Serve adapter, without Ray:
properties over drawn fleets, and a few examples with numbers."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.config import PolicyConfig
from serve_app.autoscaling.decision import Decision, Fleet, Reason, ScalingState, chat_ttft_over, decide, up_reason
from serve_app.autoscaling.serve_policy import slo_autoscaling_policy
from serve_app.autoscaling.signals import ATTAINMENT_WINDOW_S, CHAT_PROBE_TOKENS, ReplicaSignals, replica_signals
from serve_app.config.autoscaling import SloScalingKnobs, slo_scaling_knobs
from serve_app.config.config_model import ConfigError
from serve_app.replica.backend import ReplicaLoad
from serve_app.routing.ttft_prediction import predict_ttft_s
from tests.hypothesis_budget import examples

NOW_S = 10_000.0
SETTLE_S = 20.0
SETTLED = ScalingState()
KNOBS = SloScalingKnobs()


def signals(
    ratio: float | None = 0.2,
    queued_s: float | None = 0.0,
    running: float = 0,
    queued: float = 0,
    slots: float = 32,
    target_s: float = 0.5,
    attainment: float | None = None,
) -> ReplicaSignals:
    return ReplicaSignals(
        engine_running_requests=running,
        engine_queued_requests=queued,
        engine_max_running_requests=slots,
        chat_ttft_target_s=target_s,
        queued_prefill_s=queued_s,
        predicted_chat_ttft_s=None if ratio is None else ratio * target_s,
        chat_slo_attainment=attainment,
    )


def fleet(replicas: list[ReplicaSignals], target: int | None = None, lo: int = 1, hi: int = 8) -> Fleet:
    return Fleet(replicas, len(replicas) if target is None else target, lo, hi)


def decided(f: Fleet, knobs: SloScalingKnobs = KNOBS, state: ScalingState = SETTLED) -> Decision:
    return decide(f, knobs, state, NOW_S, SETTLE_S)


# -- strategies -------------------------------------------------------------------------------------------


@st.composite
def knob_sets(draw: st.DrawFn) -> SloScalingKnobs:
    up = draw(st.floats(0.3, 1.0))
    return SloScalingKnobs(
        up_ttft_fraction=up,
        down_ttft_fraction=draw(st.floats(0.05, up * 0.9)),
        backlog_horizon_s=draw(st.floats(1.0, 60.0)),
        down_backlog_fraction=draw(st.floats(0.1, 0.9)),
        down_occupancy_fraction=draw(st.floats(0.1, 0.9)),
        attainment_floor=draw(st.floats(0.5, 1.0)),
    )


@st.composite
def replica_signals_(draw: st.DrawFn) -> ReplicaSignals:
    return signals(
        ratio=draw(st.none() | st.floats(0.0, 4.0)),
        queued_s=draw(st.none() | st.floats(0.0, 200.0)),
        running=draw(st.integers(0, 40)),
        queued=draw(st.integers(0, 40)),
        slots=draw(st.sampled_from([0, 10, 32])),
        target_s=draw(st.floats(0.1, 3.0)),
        attainment=draw(st.none() | st.floats(0.0, 1.0)),
    )


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    lo = draw(st.integers(1, 4))
    hi = draw(st.integers(lo, 10))
    target = draw(st.integers(lo, hi))
    published = draw(st.integers(0, target + 1))  # one more: a replica Serve is stopping still reports
    return Fleet(draw(st.lists(replica_signals_(), min_size=published, max_size=published)), target, lo, hi)


states = st.none() | st.floats(0.0, 2 * SETTLE_S)


def state_of(age_s: float | None) -> ScalingState:
    return ScalingState(None if age_s is None else NOW_S - age_s)


def settled(f: Fleet, state: ScalingState) -> bool:
    return f.starting == 0 and (state.last_starting_s is None or NOW_S - state.last_starting_s >= SETTLE_S)


# -- properties -------------------------------------------------------------------------------------------


@settings(max_examples=examples(500), deadline=None, derandomize=True)
@given(fleets(), knob_sets(), states)
def test_the_decision_stays_within_the_bounds(f: Fleet, knobs: SloScalingKnobs, age_s: float | None) -> None:
    d = decide(f, knobs, state_of(age_s), NOW_S, SETTLE_S)
    assert f.min_replicas <= d.replicas <= f.max_replicas


@settings(max_examples=examples(500), deadline=None, derandomize=True)
@given(fleets(), knob_sets(), states)
def test_a_settled_fleet_scales_up_whenever_the_best_chat_ttft_is_over_the_target(
    f: Fleet, knobs: SloScalingKnobs, age_s: float | None
) -> None:
    state = state_of(age_s)
    ratios = f.ttft_ratios()
    if not (ratios and ratios[0] > 1.0 and settled(f, state) and f.target_replicas < f.max_replicas):
        return
    assert decide(f, knobs, state, NOW_S, SETTLE_S).replicas > f.target_replicas


@settings(max_examples=examples(500), deadline=None, derandomize=True)
@given(fleets(), knob_sets(), states)
def test_never_scales_down_while_an_up_condition_holds(f: Fleet, knobs: SloScalingKnobs, age_s: float | None) -> None:
    d = decide(f, knobs, state_of(age_s), NOW_S, SETTLE_S)
    if up_reason(f, knobs) is not None:
        assert d.replicas >= f.target_replicas
    else:
        assert d.replicas >= f.target_replicas - 1  # down one at a time


@settings(max_examples=examples(500), deadline=None, derandomize=True)
@given(fleets(), knob_sets(), states)
def test_starting_replicas_suppress_a_second_scale_up(f: Fleet, knobs: SloScalingKnobs, age_s: float | None) -> None:
    """While replicas asked for have not published, only a backlog too big even for them adds more; nothing goes
    down."""
    state = state_of(age_s)
    if f.starting == 0:
        return
    d = decide(f, knobs, state, NOW_S, SETTLE_S)
    backlog_needs = math.ceil(f.queued_prefill_s / knobs.backlog_horizon_s)
    if backlog_needs <= f.target_replicas:
        assert d.replicas == f.target_replicas
    else:
        assert d.replicas == min(f.max_replicas, backlog_needs)
    assert d.state.last_starting_s == NOW_S


@settings(max_examples=examples(300), deadline=None, derandomize=True)
@given(knob_sets(), st.integers(1, 4), st.integers(0, 6), st.sampled_from([0, 10, 32]))
def test_an_idle_fleet_goes_down_one_replica_at_a_time_to_its_minimum(
    knobs: SloScalingKnobs, lo: int, extra: int, slots: int
) -> None:
    n, hi, steps = lo + extra, lo + extra, []
    while True:
        d = decided(fleet([signals(ratio=0.0, slots=slots)] * n, lo=lo, hi=hi), knobs)
        if d.replicas == n:
            break
        steps.append(n - d.replicas)
        n = d.replicas
    assert n == lo and steps == [1] * extra


@st.composite
def constant_loads(draw: st.DrawFn) -> dict[str, float]:
    """A fleet-wide load spread evenly: each replica queues and runs its share, and a new chat's predicted TTFT is an
    idle part plus a part that grows with the replica's share of the queue."""
    return {
        "queued_s": draw(st.floats(0.0, 300.0)),
        "requests": draw(st.floats(0.0, 200.0)),
        "idle_ratio": draw(st.floats(0.0, 1.2)),
        "ratio_per_queued_s": draw(st.floats(0.0, 0.2)),
    }


def spread(load: dict[str, float], n: int) -> list[ReplicaSignals]:
    share = load["queued_s"] / n
    ratio = load["idle_ratio"] + load["ratio_per_queued_s"] * share
    return [signals(ratio=ratio, queued_s=share, running=load["requests"] / n)] * n


@settings(max_examples=examples(400), deadline=None, derandomize=True)
@given(constant_loads(), knob_sets(), st.integers(1, 4), st.integers(0, 8), st.data())
def test_a_constant_load_settles_without_flapping(
    load: dict[str, float], knobs: SloScalingKnobs, lo: int, extra: int, data: st.DataObject
) -> None:
    """Each step: Serve starts what was asked for, the load spreads over it, the aggregates settle; the targets
    never turn back, reach a count that then stays, and a backlog's step up is its last unless the chats' TTFT
    still asks for more."""
    hi = lo + extra
    n = data.draw(st.integers(lo, hi))
    targets, reasons = [n], []
    for _ in range(hi - lo + 2):
        d = decided(fleet(spread(load, n), lo=lo, hi=hi), knobs)
        targets.append(d.replicas)
        reasons.append(d.reason)
        n = d.replicas
    moves = [b - a for a, b in itertools.pairwise(targets) if b != a]
    assert all(m > 0 for m in moves) or all(m < 0 for m in moves), targets
    assert targets[-1] == targets[-2], targets
    after = fleet(spread(load, targets[1]), lo=lo, hi=hi)
    if reasons[0] is Reason.BACKLOG and not chat_ttft_over(after, knobs):
        assert targets[2] == targets[1], targets  # the backlog's count holds what it asked for


# -- examples ---------------------------------------------------------------------------------------------


def test_a_backlog_adds_as_many_replicas_as_it_needs_at_once() -> None:
    """Four replicas each with 25 s of documents queued: 100 s, cleared in 10 s by ten replicas, capped at eight."""
    d = decided(fleet([signals(ratio=0.5, queued_s=25.0)] * 4))
    assert (d.replicas, d.reason) == (8, Reason.BACKLOG)
    d = decided(fleet([signals(ratio=0.5, queued_s=13.0)] * 4))
    assert (d.replicas, d.reason) == (6, Reason.BACKLOG)  # 52 s: six replicas of 10 s


def test_the_best_chat_ttft_near_the_target_adds_one_replica() -> None:
    d = decided(fleet([signals(ratio=0.95), signals(ratio=1.4), signals(ratio=2.0)]))
    assert (d.replicas, d.reason) == (4, Reason.CHAT_TTFT)
    d = decided(fleet([signals(ratio=0.85), signals(ratio=1.4), signals(ratio=2.0)]))
    assert (d.replicas, d.reason) == (3, Reason.STEADY)  # one replica still has room for a chat


def test_low_attainment_adds_one_replica_and_none_measured_counts_as_nothing() -> None:
    assert decided(fleet([signals(attainment=0.8)] * 2)).reason is Reason.ATTAINMENT
    assert decided(fleet([signals(attainment=0.95)] * 2)).reason is not Reason.ATTAINMENT
    assert decided(fleet([signals(attainment=None)] * 2)).reason is not Reason.ATTAINMENT


def test_replicas_still_starting_hold_the_fleet_and_then_it_settles() -> None:
    busy = [signals(ratio=1.5)] * 4
    d = decided(fleet(busy, target=5))  # the fifth asked for has not published
    assert (d.replicas, d.reason) == (5, Reason.STARTING)
    later = decide(fleet([*busy, signals(ratio=1.5)]), KNOBS, d.state, NOW_S + SETTLE_S / 2, SETTLE_S)
    assert (later.replicas, later.reason) == (5, Reason.STARTING)  # aggregates still hold samples from before
    settled_ = decide(fleet([*busy, signals(ratio=1.5)]), KNOBS, d.state, NOW_S + SETTLE_S, SETTLE_S)
    assert (settled_.replicas, settled_.reason) == (6, Reason.CHAT_TTFT)


def test_scale_down_needs_every_margin() -> None:
    quiet = signals(ratio=0.1, queued_s=1.0, running=4)
    assert decided(fleet([quiet] * 4)).replicas == 3
    # 3 replicas x 10 s x 0.5 = 15 s of queue at most
    assert decided(fleet([replace(quiet, queued_prefill_s=4.0)] * 4)).replicas == 4
    # 3 x 32 slots x 0.5 = 48 requests at most
    assert decided(fleet([replace(quiet, engine_running_requests=13)] * 4)).replicas == 4
    # second best 0.5 x 4/3 over 0.6
    assert decided(fleet([quiet, *[signals(ratio=0.5, queued_s=1.0, running=4)] * 3])).replicas == 4


def test_knobs_are_strict_and_keep_a_band_between_up_and_down() -> None:
    assert slo_scaling_knobs({}) == SloScalingKnobs()
    with pytest.raises(ConfigError, match=r"policy_kwargs\.up_ttft_fractoin"):
        slo_scaling_knobs({"up_ttft_fractoin": 0.8})
    with pytest.raises(ConfigError, match=r"policy_kwargs\.backlog_horizon_s.*got -1"):
        slo_scaling_knobs({"backlog_horizon_s": -1})
    with pytest.raises(ConfigError, match=r"down_ttft_fraction=0\.9 must be below up_ttft_fraction=0\.8"):
        slo_scaling_knobs({"up_ttft_fraction": 0.8, "down_ttft_fraction": 0.9})


# -- signals ------------------------------------------------------------------------------------------------


def test_a_replica_publishes_its_load_as_signals_with_the_one_ttft_prediction() -> None:
    load = ReplicaLoad(
        num_waiting=2,
        num_prefilling=1,
        num_decoding=5,
        prefill_tokens=30_000,
        max_running_requests=32,
        prefill_tok_per_s=10_000.0,
        pass_fixed_s=0.02,
        pass_tokens=8192,
        short_first=True,
    )
    metrics = replica_signals(load, PolicyConfig(ttft_target_s=0.7))
    assert metrics is not None
    assert metrics.to_metrics() == {
        "engine_running_requests": 6.0,
        "engine_queued_requests": 2.0,
        "engine_max_running_requests": 32.0,
        "chat_ttft_target_s": 0.7,
        "queued_prefill_s": 3.0,
        "predicted_chat_ttft_s": predict_ttft_s(load, CHAT_PROBE_TOKENS),
    }
    assert ReplicaSignals.from_metrics(metrics.to_metrics()) == metrics


def test_a_replica_without_a_rate_publishes_no_prediction_and_a_loading_one_nothing() -> None:
    no_rate = replica_signals(ReplicaLoad(prefill_tokens=100), PolicyConfig())
    assert no_rate is not None
    assert "predicted_chat_ttft_s" not in no_rate.to_metrics() and "queued_prefill_s" not in no_rate.to_metrics()
    assert replica_signals(ReplicaLoad(ready=False), PolicyConfig()) is None
    assert ReplicaSignals.from_metrics({"running_requests": 3.0}) is None  # Serve's own key alone: not published


# -- the Serve adapter ----------------------------------------------------------------------------------------


def context(target: int, metrics: dict[str, dict[str, float]], kwargs: Any, state: dict[str, Any]) -> Any:
    """The fields of Serve's `AutoscalingContext` the policy reads."""
    return SimpleNamespace(
        deployment_id="fairshare#Engine",
        target_num_replicas=target,
        running_replicas=list(metrics),
        aggregated_metrics={k: {r: m[k] for r, m in metrics.items() if k in m} for m in metrics.values() for k in m},
        capacity_adjusted_min_replicas=1,
        capacity_adjusted_max_replicas=8,
        policy_state=state,
        current_time=NOW_S,
        config=SimpleNamespace(policy=SimpleNamespace(policy_kwargs=kwargs), look_back_period_s=SETTLE_S),
    )


def test_the_adapter_reads_serves_aggregates_per_replica() -> None:
    busy = signals(ratio=1.5, queued_s=2.0).to_metrics()
    ctx = context(3, {"r1": busy, "r2": busy, "r3": {"running_requests": 0.0}}, {}, {"__decision_counters": 2})
    replicas, state = slo_autoscaling_policy(ctx)
    assert replicas == 3  # r3 runs but has not published: capacity coming
    assert state["slo_reason"] == Reason.STARTING.value and state["__decision_counters"] == 2
    ctx = context(3, {"r1": busy, "r2": busy, "r3": busy}, {"up_ttft_fraction": 0.8}, {})
    assert slo_autoscaling_policy(ctx)[0] == 4


def test_the_adapter_settles_for_the_look_back_and_the_replicas_attainment_window() -> None:
    """After the last replica started, Serve's means hold a look-back period of samples from before, and each
    replica's attainment its own window before that: the fleet is judged again only after both."""
    busy = dict.fromkeys(("a", "b", "c"), signals(ratio=1.5).to_metrics())
    for since_s, replicas in ((SETTLE_S + ATTAINMENT_WINDOW_S - 1, 3), (SETTLE_S + ATTAINMENT_WINDOW_S, 4)):
        state = ScalingState(last_starting_s=NOW_S - since_s).to_dict()
        assert slo_autoscaling_policy(context(3, busy, {}, state))[0] == replicas, since_s


def test_the_adapter_holds_the_fleet_on_bad_knobs_instead_of_raising_in_serves_controller() -> None:
    busy = signals(ratio=1.5).to_metrics()
    replicas, state = slo_autoscaling_policy(context(3, dict.fromkeys(("a", "b", "c"), busy), {"up": 1}, {}))
    assert replicas == 3 and "policy_kwargs.up" in state["slo_config_error"]
    replicas, state = slo_autoscaling_policy(context(3, dict.fromkeys(("a", "b", "c"), busy), {}, state))
    assert replicas == 4 and "slo_config_error" not in state
