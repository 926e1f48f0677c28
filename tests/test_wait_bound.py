"""One wait bound for the router and the engine: the longest pass a chat arriving now may wait for, which replicas
publish to routers (`serve_app.routing.ttft_prediction.wait_pass_seconds`), is the bound the engine's SLO sizer puts
on its next pass (`scheduler.slo_sizing.arrival_wait_s`, the sizer's own `in_flight_bound_s`)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.config import PolicyConfig
from scheduler.pass_cost import PassCost
from scheduler.planner import PassPlanner
from scheduler.sim.presets import PRESETS
from scheduler.slo_sizing import arrival_wait_s, in_flight_bound_s
from scheduler.snapshot import Candidate
from serve_app.config import AppConfig, EngineKnobs
from serve_app.engines.sim.sim_backend import SimBackend
from serve_app.routing.ttft_prediction import wait_pass_seconds
from tests.factories import snap
from tests.hypothesis_budget import examples
from tests.test_slo_sizing import COSTS


@dataclass(frozen=True)
class StatedError:
    """A cost model that states a relative error (as the online fit does): the sizer charges every second with it."""

    cost: PassCost
    relative_error: float

    def pass_s(self, prefill_tokens: int, prefill_ctx_pairs: float, decode_rows: int, decode_ctx_tokens: int) -> float:
        return self.cost.pass_s(prefill_tokens, prefill_ctx_pairs, decode_rows, decode_ctx_tokens)


def document(ctx: int) -> Candidate:
    return Candidate("doc", 100_000, 0, ctx)


def sizer_bound(planner: PassPlanner, ctx: int, admission_lag: int, output_lag: int) -> float | None:
    """The bound the planner puts on its next pass at an engine prefilling a document, no streams decoding, no chat
    waiting: the TTFT bound a chat arriving during that pass keeps its target by."""
    plan = planner.plan(
        snap([], continuing=[document(ctx)], admission_lag_passes=admission_lag, output_lag_passes=output_lag)
    )
    return plan.pass_bound_s


POLICIES = st.builds(
    PolicyConfig,
    ttft_target_s=st.floats(0.01, 5.0),
    adaptive_pass=st.booleans(),
    slo_sizing=st.booleans(),
    chunk_budget_tokens=st.sampled_from([512, 2048, 8192]),
    interactive_pass_tokens=st.just(256),
    long_pass_floor_tokens=st.just(128),
)
MODELS = st.one_of(
    st.sampled_from([p.cost for p in PRESETS.values()]),
    COSTS,
    st.builds(StatedError, COSTS, st.floats(0.0, 1.0)),
)


@settings(max_examples=examples(300), deadline=None, derandomize=True)
@given(
    POLICIES,
    MODELS,
    st.lists(st.integers(1, 2048), max_size=8),
    st.integers(0, 1),
    st.integers(0, 1),
    st.integers(0, 200_000),
)
def test_the_routers_wait_bound_is_the_bound_the_engines_sizer_puts_on_its_next_pass(
    policy, cost, chat_prompts, admission_lag, output_lag, ctx
):
    planner = PassPlanner(policy, pass_cost=cost)
    planner.sizer.slo.chat_prompts.record(chat_prompts)  # the chat's own pass is the sizer's reserve, as it moves
    published = wait_pass_seconds(policy, planner.sizer.slo.arrival_own_pass_s(cost), admission_lag, output_lag)
    bound = sizer_bound(planner, ctx, admission_lag, output_lag)
    if policy.adaptive_pass and policy.slo_sizing:
        assert bound is not None
        assert published == max(0.0, bound)  # exactly: one function; 0 where no pass size keeps the target
    else:
        assert (published, bound) == (0.0, None)  # passes not sized in seconds: none published


def test_without_a_cost_model_that_predicts_no_seconds_bound_the_wait():
    policy = PolicyConfig()
    planner = PassPlanner(policy)
    assert planner.sizer.slo.arrival_own_pass_s(None) is None
    assert wait_pass_seconds(policy, None, 0, 0) == 0.0
    assert sizer_bound(planner, 0, 0, 0) is None  # the static knobs size the pass


@pytest.mark.parametrize("ttft_s", [0.1, 0.5, 0.8, 3.0])
def test_without_the_engines_figures_the_bound_is_sglangs_on_a_gpu_with_no_own_pass(ttft_s):
    policy = PolicyConfig(ttft_target_s=ttft_s)
    assert wait_pass_seconds(policy) == in_flight_bound_s(ttft_s, 0.0, 1, 0) == ttft_s / 2
    assert arrival_wait_s(policy.with_overrides(slo_sizing=False), 0.0, 1) == 0.0


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_sim_replica_publishes_its_own_engines_bound(preset):
    backend = SimBackend(AppConfig(sim={"preset": preset}), EngineKnobs())
    published = backend.load().wait_pass_s
    planner = backend.scheduler.planner
    # The simulator plans no pass ahead of an arrival and sends first tokens with their pass: no lags.
    assert published == sizer_bound(planner, 0, 0, 0)
    assert 0 < published < backend.policy.ttft_target_s


def test_the_plugin_reports_its_sizers_bound_and_the_policy_it_runs():
    from scheduler.pass_cost_fit import LinearPassCost, OnlinePassCost
    from scheduler.sglang_plugin.attach import SchedulerPolicy

    cfg = PolicyConfig(max_running_requests=32, ttft_target_s=0.6)
    fit = OnlinePassCost()
    planner = PassPlanner(cfg, pass_cost=fit)
    unfitted = SchedulerPolicy(planner, pass_cost=fit, admission_lag_passes=1).describe()
    assert unfitted["policy"] == cfg.model_dump()
    assert unfitted["wait_pass_s"] == 0.0  # the fit predicts nothing yet: the static knobs size the passes
    # As if fitted from passes of up to 8192 tokens: it predicts a chat's pass without extrapolating.
    fit.model, fit.num_fits = LinearPassCost(0.01, 1e-4, 0.0, 1e-4, 0.0), 1
    fit.measured_prefill_tokens, fit.measured_prefill_pairs = 8192, 8192 * 8193 / 2
    for lags in ((1, 0), (0, 1), (0, 0)):
        state = SchedulerPolicy(
            planner, pass_cost=fit, admission_lag_passes=lags[0], output_lag_passes=lags[1]
        ).describe()
        own_s = planner.sizer.slo.arrival_own_pass_s(fit)
        assert own_s is not None and own_s > 0
        assert state["wait_pass_s"] == wait_pass_seconds(cfg, own_s, *lags) > 0
        assert state["wait_pass_s"] == max(0.0, sizer_bound(PassPlanner(cfg, pass_cost=fit), 0, *lags) or 0.0)
