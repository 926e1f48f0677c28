"""Per-tenant limits at the router (rule 7): a tenant's queued prompt tokens, counted from what the router sent and
what replicas publish, and the 429 that names the tenant. The lane policy on its own: fake replicas, no Ray."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.config import RoutingKnobs
from serve_app.replica.backend import ReplicaLoad
from serve_app.routing.backpressure import BackpressureLimits, Shed, ShedReason
from serve_app.routing.lane_policy import ARRIVAL_MARGIN_S, LanePolicy
from serve_app.routing.records import PUBLISHED_PENDING, Lane, ReplicaView, RouteDecision, RouteHint
from serve_app.routing.tenant_limits import tenant_shed
from tests.hypothesis_budget import examples
from tests.serve.strategies import limits_st
from tests.serve.test_routing import T0, views_of

TENANTS = ["acme", "beta", "default"]
NO_LIMITS = RoutingKnobs()


def request(tenant: str, tokens: int, limit: int | None = None, knob: int | None = None, rid: str = "") -> RouteHint:
    """A request of `tokens` uncached prompt tokens (no prefix: uncached everywhere) billed to `tenant`."""
    knobs = RoutingKnobs(tenant_max_queued_prefill_tokens=knob)
    return RouteHint(
        None, tokens, knobs=knobs, request_id=rid or None, tenant=tenant, tenant_max_queued_prefill_tokens=limit
    )


def idle(rid: str = "R1", at: float = T0, **published) -> ReplicaView:
    return ReplicaView(rid, Lane.BOTH, ReplicaLoad(), at, **published)


# -- the rule --------------------------------------------------------------------------------------


def test_a_tenant_with_nothing_queued_takes_any_one_request() -> None:
    assert tenant_shed("acme", 0, 500_000, 1000, BackpressureLimits()) is None
    assert tenant_shed("acme", 1, 999, 1000, BackpressureLimits()) is None
    shed = tenant_shed("acme", 1, 1000, 1000, BackpressureLimits(prefill_tokens_per_s=0.5))
    assert isinstance(shed, Shed) and (shed.status, shed.reason) == (429, ShedReason.TENANT_PREFILL_TOKENS)
    assert (
        shed.message == "tenant 'acme' has 1 prompt tokens queued, 1001 with this request, over its limit of "
        "1000; retry after 2 s."
    )
    error = shed.error()
    assert (error.code, error.type, error.headers) == (
        "rate_limit_exceeded",
        "rate_limit_exceeded",
        {"Retry-After": "2"},
    )


def test_the_key_tables_limit_overrides_the_knob_and_none_is_no_limit() -> None:
    assert request("acme", 1, limit=5, knob=10).tenant_limit_tokens == 5
    assert request("acme", 1, knob=10).tenant_limit_tokens == 10
    assert request("acme", 1).tenant_limit_tokens is None


def test_a_flood_is_shed_from_the_tenant_that_floods() -> None:
    p = LanePolicy()
    views = [idle("R1"), idle("R2")]
    outcomes = []
    for i in range(10):
        flood = p.decide(f"f{i}", request("flood", 20_000, limit=50_000), views, T0 + 1)
        steady = p.decide(f"s{i}", request("steady", 3_000, knob=50_000), views, T0 + 1)
        outcomes.append((flood, steady))
        p.on_completed(f"s{i}", T0 + 1)  # the steady tenant's requests finish as it sends them
    assert [isinstance(f, RouteDecision) for f, _ in outcomes] == [True, True] + [False] * 8
    assert all(isinstance(s, RouteDecision) for _, s in outcomes)
    shed = outcomes[2][0]
    assert isinstance(shed, Shed) and "tenant 'flood' has 40000 prompt tokens queued" in shed.message


# -- what a tenant has queued ------------------------------------------------------------------------


def test_a_tenants_queue_is_what_its_requests_have_left_to_prefill() -> None:
    p = LanePolicy()
    for i in range(2):
        p.decide(f"a{i}", request("acme", 10_000, rid=f"q{i}"), [idle()], T0 + 1)
    p.decide("b0", request("beta", 7_000, rid="b"), [idle()], T0 + 1)
    assert p.tenant_queued_tokens("acme", [idle()]) == 20_000  # sent after the last publication: whole
    # A later publication: q0 has 4000 left; q1 is not in it, so its first token is out.
    later = idle(at=T0 + 2, pending={"q0": 4_000, "b": 7_000})
    assert p.tenant_queued_tokens("acme", [later]) == 4_000
    p.decide("a2", request("acme", 10_000, rid="q2"), [later], T0 + 3)  # sent since: whole
    assert p.tenant_queued_tokens("acme", [later]) == 14_000
    p.on_completed("a0", T0 + 4)  # Serve says it completed: gone
    assert p.tenant_queued_tokens("acme", [later]) == 10_000
    assert p.tenant_queued_tokens("beta", [later]) == 7_000


def test_a_request_sent_just_before_a_publication_may_not_be_in_it_and_still_counts() -> None:
    p = LanePolicy()
    p.decide("a0", request("acme", 10_000, rid="q0"), [idle()], T0 + 1)
    assert p.tenant_queued_tokens("acme", [idle(at=T0 + 1 + ARRIVAL_MARGIN_S / 2)]) == 10_000
    assert p.tenant_queued_tokens("acme", [idle(at=T0 + 1 + 2 * ARRIVAL_MARGIN_S)]) == 0


def test_a_full_list_of_pending_requests_leaves_what_it_does_not_name_whole() -> None:
    p = LanePolicy()
    p.decide("a0", request("acme", 10_000, rid="q0"), [idle()], T0 + 1)
    full = {f"other{i}": 1 for i in range(PUBLISHED_PENDING)}
    assert p.tenant_queued_tokens("acme", [idle(at=T0 + 5, pending=full)]) == 10_000


def test_a_request_on_a_replica_gone_from_the_candidates_counts_until_it_completes() -> None:
    p = LanePolicy()
    p.decide("a0", request("acme", 10_000, rid="q0"), [idle("R1")], T0 + 1)
    assert p.tenant_queued_tokens("acme", [idle("R2", at=T0 + 5)]) == 10_000


def test_admin_requests_are_never_shed_for_their_tenant() -> None:
    p = LanePolicy()
    p.decide("a0", request("default", 10_000, knob=5_000), [idle()], T0 + 1)
    target = RouteHint(None, 10_000, knobs=RoutingKnobs(tenant_max_queued_prefill_tokens=1), target_replica="R1")
    assert isinstance(p.decide("admin", target, [idle()], T0 + 1), RouteDecision)


# -- properties over random replicas and tenants ------------------------------------------------------

request_st = st.tuples(st.sampled_from(TENANTS), st.integers(1, 60_000), st.booleans())
"""A request: its tenant, its prompt, and whether one of the router's earlier requests completes before it."""
limit_st = st.one_of(st.none(), st.integers(1, 100_000))


def run(views, requests, own_limits, knob):
    """Each request decided in turn, with what each tenant has queued before it by the test's own count (views
    published before every send: a request admitted counts whole until Serve says it completed)."""
    p = LanePolicy()
    queued: dict[str, dict[str, int]] = {t: {} for t in TENANTS}
    for i, (tenant, tokens, completes_one) in enumerate(requests):
        sent = [(t, rid) for t in TENANTS for rid in queued[t]]
        if completes_one and sent:
            t, rid = sent[i % len(sent)]
            p.on_completed(rid, T0 + i)
            del queued[t][rid]
        before = sum(queued[tenant].values())
        d = p.decide(f"r{i}", request(tenant, tokens, own_limits[tenant], knob), views, T0 + 1 + i)
        if isinstance(d, RouteDecision):
            assert d.uncached_tokens == tokens
            queued[tenant][f"r{i}"] = tokens
        limit = own_limits[tenant] if own_limits[tenant] is not None else knob
        yield tenant, tokens, before, limit, d


@settings(deadline=None, max_examples=examples(300))
@given(
    views=st.lists(views_of(6, limits=limits_st), min_size=1, max_size=4, unique_by=lambda v: v.replica_id),
    requests=st.lists(request_st, min_size=1, max_size=12),
    own_limits=st.fixed_dictionaries(dict.fromkeys(TENANTS, limit_st)),
    knob=limit_st,
)
def test_a_tenant_under_its_limit_is_never_shed_for_another_tenants_queue(views, requests, own_limits, knob) -> None:
    for tenant, tokens, before, limit, d in run(views, requests, own_limits, knob):
        if isinstance(d, Shed) and d.reason is ShedReason.TENANT_PREFILL_TOKENS:
            assert d.message.startswith(f"tenant {tenant!r} has {before} prompt tokens queued")
            assert limit is not None and before > 0 and before + tokens > limit
        under = limit is None or before == 0 or before + tokens <= limit
        if under:
            assert not (isinstance(d, Shed) and d.reason is ShedReason.TENANT_PREFILL_TOKENS)


@settings(deadline=None, max_examples=examples(300))
@given(
    views=st.lists(views_of(6), min_size=1, max_size=4, unique_by=lambda v: v.replica_id),
    requests=st.lists(request_st, min_size=1, max_size=12),
    own_limits=st.fixed_dictionaries(dict.fromkeys(TENANTS, limit_st)),
    knob=limit_st,
)
def test_a_tenant_over_its_limit_is_shed_naming_itself_and_its_limit(views, requests, own_limits, knob) -> None:
    views = [replace(v, limits=None) for v in views]  # no replica is over a limit of its own: only tenants shed
    for tenant, tokens, before, limit, d in run(views, requests, own_limits, knob):
        over = limit is not None and before > 0 and before + tokens > limit
        assert isinstance(d, Shed) == over
        if isinstance(d, Shed):
            assert (d.status, d.reason, d.retry_after_s >= 1) == (429, ShedReason.TENANT_PREFILL_TOKENS, True)
            assert f"tenant {tenant!r} has {before} prompt tokens queued" in d.message
            assert f"over its limit of {limit};" in d.message
