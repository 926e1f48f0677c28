"""Rule 7 of the lane policy, tenant limits: what a tenant has queued as one router counts it, and the 429 when a
request would take it over its limit.

A tenant (whom a request is billed to) may have a limit on the uncached prompt tokens its requests have queued for
prefill (`RouteHint.tenant_limit_tokens`: its key's, else `RoutingKnobs.tenant_max_queued_prefill_tokens`). The
router counts them from what it sent (`queued_tokens`): each request still without its first token, by what its
replica last published it has left to prefill, or whole where no publication made since it was sent speaks for it.
Over the limit the request is shed with 429 naming the tenant, whatever the replicas' loads and whatever other
tenants have queued: set below the replicas' own limits (`backpressure`), it sheds a flood from the tenant that
floods, not from everyone. A tenant with nothing queued takes any one request, as a replica does, so a document above
the limit is never refused forever. With several ingress replicas, each router counts what it sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from serve_app.routing.backpressure import BackpressureLimits, Shed, ShedReason, retry_after_s
from serve_app.routing.records import (
    ARRIVAL_MARGIN_S,
    PUBLISHED_PENDING,
    ReplicaView,
    RouteDecision,
    RouteHint,
    RouteReason,
)


class SentRequest(Protocol):
    """A request the router sent and has not seen complete (`lane_policy`'s record of it)."""

    @property
    def replica_id(self) -> str: ...
    @property
    def request_id(self) -> str | None: ...
    @property
    def uncached_tokens(self) -> int: ...
    @property
    def decided_s(self) -> float: ...
    @property
    def tenant(self) -> str: ...


def over_limit(
    hint: RouteHint, d: RouteDecision, views: Sequence[ReplicaView], sent: Iterable[SentRequest]
) -> Shed | None:
    """The 429 when the request, on the replica `d` chose, would take its tenant over its limit (None: it may go)."""
    limit = hint.tenant_limit_tokens
    if limit is None or d.reason is RouteReason.TARGETED:
        return None
    chosen = next(v for v in views if v.replica_id == d.replica_id)
    queued = queued_tokens(sent, hint.tenant, views)
    return tenant_shed(hint.tenant, queued, d.uncached_tokens, limit, chosen.limits or BackpressureLimits())


def tenant_shed(
    tenant: str, queued_tokens: int, request_tokens: int, limit: int, limits: BackpressureLimits
) -> Shed | None:
    """The 429 for a request that would take its tenant's `queued_tokens` over `limit` (None: it fits), with
    `Retry-After` the excess drained at the chosen replica's rate (`limits`)."""
    total = queued_tokens + request_tokens
    if queued_tokens <= 0 or total <= limit:
        return None
    wait = retry_after_s(total - limit, limits)
    return Shed(
        429,
        ShedReason.TENANT_PREFILL_TOKENS,
        wait,
        f"tenant {tenant!r} has {queued_tokens} prompt tokens queued, {total} with this request, over its limit "
        f"of {limit}; retry after {wait} s.",
    )


def queued_tokens(sent: Iterable[SentRequest], tenant: str, views: Sequence[ReplicaView]) -> int:
    """Uncached prompt tokens of `tenant`'s requests in `sent` that have no first token yet, as far as the replicas'
    publications (`views`) tell."""
    by_id = {v.replica_id: v for v in views}
    return sum(still_queued(e, by_id.get(e.replica_id)) for e in sent if e.tenant == tenant)


def still_queued(e: SentRequest, v: ReplicaView | None) -> int:
    """What `e` has left to prefill: what its replica published (the engine's word); all of it where no publication
    made since it was sent speaks for it, or the replica left it out of a full list; none where one made since has
    no trace of it (its first token is out)."""
    if v is None:
        return e.uncached_tokens  # its replica is gone from the candidates: until Serve says it completed
    if e.request_id is not None and e.request_id in v.pending:
        return v.pending[e.request_id]
    unpublished = e.decided_s > v.stats_time_s - ARRIVAL_MARGIN_S
    return e.uncached_tokens if unpublished or len(v.pending) >= PUBLISHED_PENDING else 0
