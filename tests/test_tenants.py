"""Fair share between tenants (`scheduler.tenants`): the counters, the admission order, the weighted fill, the planner
with tenants, and the simulator's tenant scenarios against the per-request policy."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.planner import PassPlanner
from scheduler.sim.experiments import run_spec
from scheduler.sim.metrics import measure
from scheduler.sim.presets import H100_8B
from scheduler.sim.request import SimRequest
from scheduler.sim.tenant_metrics import jain, tenant_report
from scheduler.sim.workload import TENANT_DOC_TOKENS, Group, Workload, scenario
from scheduler.snapshot import Candidate
from scheduler.tenants import (
    DEFAULT_TENANT,
    TenantCounters,
    parse_tenant_key,
    tenant_fill,
    tenant_key,
    walk_order,
    weighted_fill,
)
from scheduler.traffic import TrafficClass
from tests.factories import cfg, snap
from tests.hypothesis_budget import examples


def doc(rid: str, tenant: str, tokens: int = 8000, weight: float | None = None) -> Candidate:
    return Candidate(rid, tokens, tokens + 256, tenant=tenant, tenant_weight=weight)


# -- counters ------------------------------------------------------------------------------------------------------


def test_a_tenant_that_becomes_backlogged_starts_at_the_lowest_backlogged_counter():
    c = TenantCounters()
    c.observe({"a", "b"})
    c.charge("a", 1.0, prefill_tokens=10_000)
    c.charge("b", 1.0, prefill_tokens=4_000)
    c.observe({"a", "b", "late"})
    assert c.counter("late") == 4_000  # banked nothing while away, owes nothing either


def test_an_idle_tenant_keeps_a_lead_it_earned_but_banks_nothing():
    c = TenantCounters()
    c.observe({"a", "b"})
    c.charge("a", 1.0, prefill_tokens=10_000)
    c.observe({"b"})  # a goes idle ahead of b
    assert c.counter("a") == 10_000
    c.charge("b", 1.0, prefill_tokens=20_000)
    c.observe({"b"})
    assert "a" not in c.counters  # now at or below the floor: dropped, the lift restores it
    c.observe({"a", "b"})
    assert c.counter("a") == c.counter("b") == 20_000


def test_decode_tokens_cost_twice_and_weight_divides():
    c = TenantCounters()
    c.observe({"a"})
    c.charge("a", 2.0, prefill_tokens=100, decode_tokens=50)
    assert c.counter("a") == (100 + 2 * 50) / 2.0


@given(st.lists(st.tuples(st.sets(st.sampled_from("abcdefgh")), st.sampled_from("abcdefgh"), st.integers(0, 5000))))
@settings(max_examples=examples(300), deadline=None)
def test_counters_hold_only_backlogged_tenants_or_those_ahead_of_them(steps):
    c = TenantCounters()
    for backlogged, served, tokens in steps:
        c.observe(backlogged)
        floor = c.floor()
        assert all(t in c.backlogged or value > floor for t, value in c.counters.items())
        assert all(c.counter(t) >= floor for t in c.backlogged)
        if served in backlogged:
            c.charge(served, 1.0, prefill_tokens=tokens)


# -- admission order and the fill -----------------------------------------------------------------------------------


def test_the_walk_takes_the_least_served_tenant_first_and_keeps_each_tenants_queue_order():
    c = TenantCounters()
    c.observe({"flood", "team"})
    c.charge("flood", 1.0, prefill_tokens=9_000)
    waiting = [doc(f"f{i}", "flood") for i in range(3)] + [doc("t0", "team")]
    assert [x.rid for x in walk_order(waiting, c, lambda r: 1.0)] == ["t0", "f0", "f1", "f2"]


def test_the_walk_interleaves_tenants_by_weight():
    c = TenantCounters()
    c.observe({"gold", "bronze"})
    waiting = [doc(f"b{i}", "bronze", 1000) for i in range(4)] + [doc(f"g{i}", "gold", 1000) for i in range(4)]
    weight = {"gold": 3.0, "bronze": 1.0}
    order = [x.rid for x in walk_order(waiting, c, lambda r: weight[r.tenant])]
    assert order[:5] == ["b0", "g0", "g1", "g2", "b1"]


def test_the_walk_reads_a_requests_figures_only_once_it_goes_on_past_it():
    """An engine may compute a request's figures on the first read (the sglang plugin matches it against its prefix
    cache): admission, which stops early, must not pay for the whole queue."""
    read: list[str] = []

    @dataclasses.dataclass(frozen=True)
    class Counted:
        rid: str
        tenant: str
        tenant_weight: float | None = None

        @property
        def extend_tokens(self) -> int:
            read.append(self.rid)
            return 8000

    c = TenantCounters()
    c.observe({"flood", "team"})
    c.charge("team", 1.0, prefill_tokens=100)
    waiting = [Counted(f"f{i}", "flood") for i in range(50)] + [Counted("t0", "team"), Counted("t1", "team")]
    walk = iter(walk_order(waiting, c, lambda r: 1.0))
    assert [next(walk).rid for _ in range(3)] == ["f0", "t0", "f1"]
    assert read == ["f0", "t0"]  # the third one's only when the walk goes on past it


def test_one_tenant_walks_the_queue_as_it_is():
    waiting = [doc(f"d{i}", DEFAULT_TENANT) for i in range(5)]
    assert walk_order(waiting, TenantCounters(), lambda r: 1.0) is waiting


@given(
    st.lists(st.integers(0, 50_000), min_size=1, max_size=8),
    st.lists(st.floats(0.1, 10), min_size=8, max_size=8),
    st.integers(0, 100_000),
)
@settings(max_examples=examples(500), deadline=None)
def test_the_weighted_fill_wastes_nothing_and_is_max_min_fair(wants, weights, budget):
    shares = weighted_fill(wants, weights[: len(wants)], budget)
    assert all(0 <= s <= w for s, w in zip(shares, wants, strict=True))
    assert sum(shares) == min(budget, sum(wants))  # work-conserving
    # Max-min by weight: a tenant short of its want got at least the weighted level of any other (within a token).
    for i, (s, w) in enumerate(zip(shares, wants, strict=True)):
        if s < w:
            for j, other in enumerate(shares):
                assert s / weights[i] >= other / weights[j] - 1 / weights[i] - 1e-9 or other <= wants[j]


def test_the_tenant_fill_gives_a_lone_document_half_beside_a_flood_and_f_caps_only_inside_a_tenant():
    tenants = ["flood"] * 9 + ["team"]
    wants = [409] * 10  # F in a contended pass
    demands = [8000] * 10
    shares = tenant_fill(wants, demands, tenants, {"flood": 1.0, "team": 1.0}, 8192)
    assert shares[-1] == 4096 and sum(shares[:-1]) == 4096


# -- the planner -------------------------------------------------------------------------------------------------


candidates = st.lists(
    st.builds(
        Candidate,
        rid=st.uuids().map(str),
        extend_tokens=st.integers(1, 20_000),
        need_tokens=st.integers(1, 30_000),
        ctx_tokens=st.integers(0, 10_000),
    ),
    max_size=12,
    unique_by=lambda c: c.rid,
)


@given(candidates, st.integers(0, 200_000), st.integers(0, 12), st.integers(1, 4))
@settings(max_examples=examples(300), deadline=None)
def test_with_one_tenant_the_plan_is_the_per_request_plan(waiting, free_kv, slots, max_cut):
    on, off = PassPlanner(cfg()), PassPlanner(cfg(tenant_fairness=False))
    s = snap(waiting, free_kv=free_kv, slots=slots, max_cut_requests=max_cut, tenants=frozenset({DEFAULT_TENANT}))
    assert on.plan(s) == off.plan(s)


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(2_100, 30_000)), min_size=2, max_size=10))
@settings(max_examples=examples(300), deadline=None)
def test_a_pass_shared_by_tenants_grants_what_one_tenant_alone_would(docs):
    """Tenants change who gets the pass, never how much of it is used (where the half-prefilled limit does not
    drop a request: which one it drops depends on the order, for tenants and requests alike)."""
    max_cut = len(docs)
    waiting = [doc(f"r{i}", t, n) for i, (t, n) in enumerate(docs)]
    alone = [dataclasses.replace(c, tenant=DEFAULT_TENANT) for c in waiting]
    shared = PassPlanner(cfg()).plan(snap(waiting, max_cut_requests=max_cut, tenants=frozenset(t for t, _ in docs)))
    single = PassPlanner(cfg()).plan(snap(alone, max_cut_requests=max_cut, tenants=frozenset({DEFAULT_TENANT})))
    assert shared.num_prefill_tokens == single.num_prefill_tokens


# -- the simulator ------------------------------------------------------------------------------------------------


def test_a_lone_document_gets_half_the_prefill_beside_a_flood_and_nothing_is_lost():
    w = scenario("tenant-flood", H100_8B)
    shared, by_request = run_spec(w, "fairshare", H100_8B), run_spec(w, "fairshare:tenant_fairness=false", H100_8B)
    fair, unfair = tenant_report(shared), tenant_report(by_request)
    assert fair.tenants["team"].share_while_backlogged >= 0.45 > 0.1 >= unfair.tenants["team"].share_while_backlogged
    assert fair.jain_while_backlogged >= 0.95 > unfair.jain_while_backlogged
    docs = [measure(r).classes[TrafficClass.LONG.value].long_prefill_tok_per_s for r in (shared, by_request)]
    assert docs[0] >= 0.97 * docs[1]
    assert measure(shared).classes[TrafficClass.SHORT.value].slo_attainment == 1.0


def test_weights_1_2_4_share_the_prefill_in_proportion_while_all_wait():
    report = tenant_report(run_spec(scenario("tenant-weights", H100_8B), "fairshare", H100_8B))
    for name, expected in (("bronze", 1 / 7), ("silver", 2 / 7), ("gold", 4 / 7)):
        share = report.tenants[name].share_while_all_backlogged
        assert share is not None and abs(share - expected) <= 0.1 * expected, name


def test_a_late_tenant_neither_banks_nor_owes_service():
    report = tenant_report(run_spec(scenario("tenant-late", H100_8B), "fairshare", H100_8B))
    assert abs(report.tenants["late"].share_while_backlogged - 0.5) <= 0.05


def doc_requests(arrivals: list[tuple[str, float, int]]) -> list[SimRequest]:
    return [
        SimRequest(f"{t}-{i}", n, 16, at, traffic_class=TrafficClass.LONG, tenant=t)
        for i, (t, at, n) in enumerate(arrivals)
    ]


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.floats(0, 20), st.integers(2_100, TENANT_DOC_TOKENS)),
        min_size=2,
        max_size=24,
    )
)
@settings(max_examples=examples(40), deadline=None)
def test_the_service_gap_between_backlogged_tenants_stays_within_its_bound(arrivals):
    """The gap between two tenants backlogged together never exceeds 2 (L + B) / w_min: a document in prefill is
    never preempted (one half-prefilled request: L, the longest document), and a pass grants at most B (the chunk
    budget) before the counters speak again; a newcomer starts at the lowest backlogged counter."""
    groups = [
        Group(name=f"{t}{i}", traffic_class=TrafficClass.LONG, count=1, prompt_tokens=n, arrival_s=at, tenant=t)
        for i, (t, at, n) in enumerate(arrivals)
    ]
    result = run_spec(Workload(name="random", groups=groups), "fairshare", H100_8B)
    report = tenant_report(result)
    bound = 2 * (max(n for _, _, n in arrivals) + H100_8B.chunk_budget_tokens) / 1.0
    assert report.max_service_gap_tokens is None or report.max_service_gap_tokens <= bound


@given(st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True), st.one_of(st.none(), st.floats(0.01, 1000)))
def test_a_tenant_key_reads_back_as_written(tenant, weight):
    read_tenant, read_weight = parse_tenant_key(tenant_key(tenant, weight))
    assert read_tenant == tenant
    assert read_weight == (None if weight is None or weight == 1.0 else pytest.approx(weight, rel=1e-5))


def test_no_key_is_the_default_tenant_and_a_bad_weight_is_ignored():
    assert parse_tenant_key(None) == (DEFAULT_TENANT, None)
    assert parse_tenant_key("acme*lots") == ("acme", None)
    assert parse_tenant_key("acme*-2") == ("acme", None)


def test_jain_is_one_for_equal_shares_and_one_over_n_for_one_taker():
    assert jain([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain([3.0, 0.0, 0.0]) == pytest.approx(1 / 3)
