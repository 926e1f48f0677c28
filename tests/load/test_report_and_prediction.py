"""Figures from client samples, the simulator's closed-loop prediction, and upstream through the live config."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtests.app import sglang_upstream_overrides, upstream_policy_overrides
from loadtests.prediction import population, predict
from loadtests.recording import Sample
from loadtests.report import (
    figures,
    long_prefill_tok_per_request_s,
    long_prefill_tok_per_s,
    long_prefills_at_once,
    slo_of,
    to_engine_time,
)
from loadtests.settings import LoadSettings
from loadtests.stages import Stage
from scheduler.config import PolicyConfig
from scheduler.sglang_plugin.server_args import SGLANG_OWNED_FIELDS
from scheduler.sim.experiments import run_spec
from scheduler.sim.presets import PRESETS
from scheduler.sim.request import TrafficClass
from scheduler.sim.rules import RuleSet, policy_for
from scheduler.sim.workload import Group, Workload
from scheduler.slo import SloTargets
from serve_app.config import policy_config
from tests.hypothesis_budget import examples

CARD12GB = PRESETS["card12gb-27b"]
H100_8B = PRESETS["h100-8b"]


def long_sample(sent: float, ttft: float, prompt: int, cached: int = 0) -> Sample:
    return Sample(
        user="doc", intent="long", traffic_class="long", status=200, sent_at_s=sent, ttft_s=ttft, e2e_s=ttft + 1,
        prompt_tokens=prompt, cached_tokens=cached,
    )  # fmt: skip


def test_long_throughput_counts_overlapping_documents_once() -> None:
    samples = [long_sample(0, 10, 10_000), long_sample(5, 10, 20_000, cached=5_000), long_sample(30, 5, 5_000)]
    # busy: [0, 15] and [30, 35] = 20 s; uncached tokens 10k + 15k + 5k
    assert long_prefill_tok_per_s(samples) == 30_000 / 20


def test_long_throughput_is_each_documents_own_rate_times_how_many_went_at_once() -> None:
    samples = [long_sample(0, 10, 10_000), long_sample(5, 10, 20_000, cached=5_000), long_sample(30, 5, 5_000)]
    # each one's own wait: 10 + 10 + 5 = 25 s; in flight at once while any was: 25 s of waits over 20 s busy
    assert long_prefill_tok_per_request_s(samples) == 30_000 / 25
    assert long_prefills_at_once(samples) == 25 / 20
    apart = [long_sample(0, 10, 10_000), long_sample(20, 10, 10_000)]
    assert long_prefills_at_once(apart) == 1.0
    assert long_prefill_tok_per_request_s(apart) == long_prefill_tok_per_s(apart) == 1_000
    assert long_prefill_tok_per_s([]) is None and long_prefills_at_once([]) is None


@settings(deadline=None, max_examples=examples(200))
@given(
    st.lists(
        st.tuples(st.floats(0, 1_000), st.floats(0.01, 100), st.integers(1, 100_000), st.integers(0, 100)), max_size=30
    )
)
def test_long_throughput_is_the_product_of_its_two_parts(docs: list[tuple[float, float, int, int]]) -> None:
    samples = [long_sample(sent, ttft, prompt, cached=prompt * pct // 100) for sent, ttft, prompt, pct in docs]
    rate, own, at_once = (
        f(samples) for f in (long_prefill_tok_per_s, long_prefill_tok_per_request_s, long_prefills_at_once)
    )
    if not docs:
        assert rate is own is at_once is None
        return
    assert rate is not None and own is not None and at_once is not None
    assert rate == pytest.approx(own * at_once, rel=1e-9, abs=1e-9)
    assert 1.0 - 1e-9 <= at_once <= len(docs) + 1e-9  # never fewer than one at once while any waits, nor more than all


def test_failures_and_shed_are_counted_apart() -> None:
    base = dict(user="chat", intent="short", traffic_class="short", sent_at_s=0.0)
    samples = [
        Sample(status=200, ttft_s=0.1, e2e_s=0.5, **base),
        Sample(status=429, shed=True, **base),
        Sample(status=500, error="HTTP 500", **base),
        Sample(status=200, error="stream ended without [DONE]", **base),
    ]
    f = figures(samples)
    assert (f["short requests"], f["failures"], f["shed (429/503)"]) == (1, 2, 1)


def test_short_attainment_judges_every_short_request_sent_by_the_runs_targets() -> None:
    base = dict(user="chat", intent="short", traffic_class="short")
    samples = [
        Sample(status=200, sent_at_s=0.0, ttft_s=0.2, e2e_s=1.0, itl_s=[0.05] * 10, **base),  # met
        Sample(status=200, sent_at_s=1.0, ttft_s=0.9, e2e_s=1.5, itl_s=[0.05] * 10, **base),  # TTFT over
        Sample(status=200, sent_at_s=2.0, ttft_s=0.1, e2e_s=2.0, itl_s=[0.05, 0.6], **base),  # a stall over TBT
        Sample(status=429, shed=True, sent_at_s=3.0, **base),  # shed: no first token
        long_sample(0.0, 30.0, 10_000),  # documents are not judged; their span counts
    ]
    f = figures(samples, SloTargets(ttft_s=0.5, tbt_s=0.3))
    assert f["short SLO attainment"] == 25.0
    assert f["short goodput"] == 1 / 31.0  # one met over the run's 31 s
    assert figures(samples)["short SLO attainment"] is None  # no targets, nothing judged
    assert slo_of({"ttft_target_s": 0.5, "tbt_target_s": 0.3}) == SloTargets(0.5, 0.3)


@given(st.floats(0.01, 1.0), st.floats(0, 1e9))
def test_engine_time_divides_by_the_time_scale(scale: float, start: float) -> None:
    s = long_sample(start + 2.0, 0.5, 100)
    s.itl_s = [0.1]
    (e,) = to_engine_time([s], start, scale)
    assert abs(e.sent_at_s - 2.0 / scale) < 1e-6 * max(1.0, start)
    assert abs(e.ttft_s - 0.5 / scale) < 1e-9 and abs(e.itl_s[0] - 0.1 / scale) < 1e-9


def test_upstream_through_the_live_config_is_the_baseline_rule_set() -> None:
    """The overrides, applied the way the replica applies user_config.policy, give exactly `baseline`."""
    ours, _ = policy_for(RuleSet.FAIRSHARE, CARD12GB)
    base, _ = policy_for(RuleSet.BASELINE, CARD12GB)
    live = policy_config(ours, upstream_policy_overrides(CARD12GB.name))
    assert live == base
    assert {"skip_ahead", "fair_share", "adaptive_pass"} <= set(upstream_policy_overrides(CARD12GB.name))


def test_upstream_on_sglang_is_the_baseline_rule_set_less_sglangs_own_arguments() -> None:
    """On an sglang engine the chunk size and running slots come from sglang's arguments (upstream's already): the
    overrides take every other `baseline` field, so the plugin then decides as upstream does."""
    base, _ = policy_for(RuleSet.BASELINE, H100_8B)
    live = policy_config(PolicyConfig(), sglang_upstream_overrides())  # an sglang replica's policy: the defaults
    differing = {k for k, v in live.model_dump().items() if v != base.model_dump()[k]}
    assert differing <= SGLANG_OWNED_FIELDS
    assert not set(sglang_upstream_overrides()) & SGLANG_OWNED_FIELDS


def test_a_lone_document_is_predicted_as_the_simulator_runs_it() -> None:
    """One document user, nothing else: the closed-loop driver and scheduler.sim's runner agree."""
    s = LoadSettings(doc_tokens="60000", docs_per_user=1, doc_followups=0, doc_max_tokens=16, question_tokens="30")
    (sample,) = predict(s, [Stage(1000, 1, 100, "doc")], CARD12GB, "fairshare", chat_users_fixed=0)
    w = Workload(
        name="one",
        groups=[
            Group(
                name="doc", traffic_class=TrafficClass.LONG, count=1, prompt_tokens=sample.prompt_tokens,
                output_tokens=16,
            )
        ],
    )  # fmt: skip
    (req,) = run_spec(w, "fairshare", CARD12GB).requests
    assert sample.traffic_class == "long" and sample.prompt_tokens > 60_000
    assert abs(sample.ttft_s - req.ttft_s) < 1e-9
    assert abs(sample.e2e_s - (req.finish_s - req.arrival_s)) < 1e-9


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.floats(0.5, 20), st.integers(1, 4))
def test_chat_users_are_closed_loop(users: int, think: float, turns: int) -> None:
    """A user's next question leaves a think time after its previous answer, never earlier."""
    s = LoadSettings(think_s=f"{think}", chat_turns=turns, chat_weight=1, doc_weight=0, question_tokens="30")
    samples = predict(s, [Stage(120, users, 100, "chats")], CARD12GB, "fairshare")
    assert samples and all(x.traffic_class == "short" for x in samples)
    sends = sorted(x.sent_at_s for x in samples)
    assert sends[0] >= think - 1e-9  # a person thinks before the first question
    # With one user, each send follows the previous request's end by the think time.
    if users == 1:
        ordered = sorted(samples, key=lambda x: x.sent_at_s)
        for a, b in itertools.pairwise(ordered):
            assert abs(b.sent_at_s - (a.sent_at_s + a.e2e_s + think)) < 1e-6


def test_population_follows_locust_weights_and_fixed_counts() -> None:
    s = LoadSettings(chat_weight=4, doc_weight=1)
    assert population(Stage(1, 5, 1, ""), s, None) == (4, 1)
    assert population(Stage(1, 10, 1, ""), s, None) == (8, 2)
    assert population(Stage(1, 5, 1, ""), s, 1) == (1, 4)
