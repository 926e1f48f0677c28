"""The records of routing, as they cross the ingress, the router and the engine replicas.

`RouteHint` (what the ingress knows), `RouteDecision` (the router's choice and why), `RouteTicket`
(the handle kwarg carrying both: the decision travels once), `RoutingStats` (what a replica
publishes), `ReplicaView` (a replica as one decision sees it), and the lanes.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from typing import Any

from scheduler.config import PolicyConfig
from scheduler.slo import NOT_JUDGED, SloTargets, targets_for
from scheduler.tenants import DEFAULT_TENANT
from scheduler.traffic import TrafficClass
from serve_app.config import RoutingKnobs
from serve_app.replica.backend import ReplicaLoad
from serve_app.routing.backpressure import BackpressureLimits
from serve_app.routing.ttft_prediction import DEFAULT_TTFT_TARGET_S


class Lane(StrEnum):
    LONG = "long"
    CHAT = "chat"
    BOTH = "both"


class RouteReason(StrEnum):
    AFFINITY = "affinity"  # the request's prefix (or its named session's last request) is on that replica
    LEAST_LOADED = "least-loaded"  # no usable pin: least loaded replica of the class's lane
    GAVE_WAY = "gave-way"  # the pinned replica was busy; another allowed replica was not
    MOVED = "moved"  # the pinned replica's lane does not take the request's new class
    SPILL = "spill"  # a chat in the long lane because every chat replica is busy
    NO_LANE = "no-lane"  # the class's lane has no replica: the other lane serves it
    TARGETED = "targeted"  # the caller named the replica (admin and diagnostics)


DEFAULT_SHORT_REQUEST_TOKENS = PolicyConfig.model_fields["short_request_tokens"].default
"""A replica's threshold until it has published its own."""
PUBLISHED_PENDING = 256
"""Most pending request ids a replica publishes (routers correct stale loads with them)."""
ARRIVAL_MARGIN_S = 0.05
"""A request sent this long before a load was published may not have reached the replica by then."""


@dataclass(frozen=True, slots=True)
class RouteHint:
    """What the ingress knows of a request before routing."""

    session_id: str | None
    """The session the client named (None: it named none, and needs none: placement follows the prompt's prefix)."""
    prompt_tokens: int
    prefix_pages: tuple[int, ...] = ()
    """The prompt's chained page hashes (`prefix_pages.page_hashes`), matched against what replicas hold."""
    knobs: RoutingKnobs = field(default_factory=RoutingKnobs)
    target_replica: str | None = None
    request_id: str | None = None
    """The engine request id (replicas publish the ids of their pending requests)."""
    tenant: str = DEFAULT_TENANT
    """Whom the request is billed to: the router limits each tenant's queued prompt tokens."""
    tenant_max_queued_prefill_tokens: int | None = None
    """The tenant's own limit (the key table's); None: `RoutingKnobs.tenant_max_queued_prefill_tokens`."""

    @property
    def tenant_limit_tokens(self) -> int | None:
        """The most uncached prompt tokens the tenant may have queued (None: no limit)."""
        if self.tenant_max_queued_prefill_tokens is not None:
            return self.tenant_max_queued_prefill_tokens
        return self.knobs.tenant_max_queued_prefill_tokens


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The router's choice and why."""

    replica_id: str
    lane: Lane
    """The lane the request is served in (never BOTH: a both-lanes replica serves the class's lane)."""
    traffic_class: TrafficClass
    reason: RouteReason
    uncached_tokens: int
    session_id: str | None
    slo: SloTargets = NOT_JUDGED
    """The targets the request is judged by: its class's on the chosen replica (`ReplicaView.slo_for`)."""


@dataclass(slots=True)
class RouteTicket:
    """A request's route, passed as the `route` handle kwarg.

    The ingress creates it with the hint; the router (in the ingress process, before Serve sends the
    request) records its decision on it. Serve then pickles the ticket with the request, so the decision
    travels once, ingress to engine replica, and the ingress reads it from its own ticket. On a retry
    (the chosen replica was full) the router decides again and the last decision is the one sent.
    """

    hint: RouteHint
    decision: RouteDecision | None = None
    decided_at_s: float | None = None
    """`time.perf_counter()` in the ingress process when the decision was made."""

    def record(self, decision: RouteDecision, at_s: float) -> None:
        self.decision, self.decided_at_s = decision, at_s


@dataclass(frozen=True, slots=True)
class RoutingStats:
    """What a replica publishes to routers (`record_routing_stats`; Serve carries it as a dict)."""

    lane: Lane
    load: ReplicaLoad
    short_request_tokens: int
    """The replica's `PolicyConfig.short_request_tokens`: routers classify with the engine's own knob."""
    time_s: float
    """Wall time of publication."""
    prefixes: list[int] = field(default_factory=list)
    """Prefix pages the engine holds (`prefix_pages`), the most recently stored, bounded by the replica's knob."""
    pending: dict[str, int] = field(default_factory=dict)
    """Pending requests (no first token yet): request id -> uncached tokens still to prefill."""
    limits: BackpressureLimits | None = None
    """The replica's backpressure limits (None: not published yet; the replica's own check still applies)."""
    interactive_slo: SloTargets = NOT_JUDGED
    """The replica's policy's targets for interactive requests (`PolicyConfig.ttft_target_s`, `tbt_target_s`)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "lane": self.lane.value,
            "load": self.load.to_dict(),
            "short_request_tokens": self.short_request_tokens,
            "time_s": self.time_s,
            "prefixes": self.prefixes,
            "pending": dict(self.pending),
            "limits": self.limits.model_dump() if self.limits is not None else None,
            "interactive_slo": [self.interactive_slo.ttft_s, self.interactive_slo.tbt_s],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, lane: Lane = Lane.BOTH) -> RoutingStats:
        """Parse published stats; a replica that has published nothing yet reads as idle, time 0."""
        d = d or {}
        return cls(
            lane=Lane(d.get("lane") or lane),
            load=ReplicaLoad.from_dict(d.get("load")),
            short_request_tokens=int(d.get("short_request_tokens", DEFAULT_SHORT_REQUEST_TOKENS)),
            time_s=float(d.get("time_s", 0.0)),
            # Not copied: routers read every replica's stats on every decision, and keep a set per publication.
            prefixes=d.get("prefixes") or [],
            pending=dict(d.get("pending") or {}),
            limits=_limits_from(tuple(sorted(d["limits"].items()))) if d.get("limits") else None,
            interactive_slo=SloTargets(*(d.get("interactive_slo") or (None, None))),
        )


@lru_cache(maxsize=64)
def _limits_from(items: tuple[tuple[str, Any], ...]) -> BackpressureLimits:
    # Parsed once per distinct value: routers read every replica's stats on every decision. Only the fields this
    # version knows: during a rolling update a replica of another version may publish one more or one fewer.
    return BackpressureLimits.model_validate({k: v for k, v in items if k in BackpressureLimits.model_fields})


@dataclass(frozen=True, slots=True)
class ReplicaView:
    replica_id: str
    lane: Lane
    load: ReplicaLoad
    stats_time_s: float = 0.0
    """Wall time of the published load (0 = nothing published yet)."""
    prefixes: Container[int] = frozenset()
    """Published prefix pages the engine holds."""
    pending: Mapping[str, int] = field(default_factory=dict)
    """Published pending requests (no first token yet): request id -> uncached tokens still to prefill."""
    full: bool = False
    """Serve's own limit: the replica has max_ongoing_requests in flight."""
    short_request_tokens: int = DEFAULT_SHORT_REQUEST_TOKENS
    limits: BackpressureLimits | None = None
    """Published backpressure limits (None: unknown, the replica is taken to admit)."""
    interactive_slo: SloTargets = NOT_JUDGED
    """Published interactive targets (none judged until the replica publishes)."""

    def slo_for(self, cls: TrafficClass) -> SloTargets:
        return targets_for(cls, self.interactive_slo)

    @property
    def ttft_target_s(self) -> float:
        """The TTFT target chats are placed within: the one the replica published, the policy's default before."""
        return self.interactive_slo.ttft_s or DEFAULT_TTFT_TARGET_S

    @classmethod
    def from_stats(
        cls, replica_id: str, stats: RoutingStats, full: bool = False, prefixes: Container[int] | None = None
    ) -> ReplicaView:
        """`prefixes`: the published pages as a set, when the caller keeps one (built once per publication)."""
        return cls(
            replica_id,
            stats.lane,
            stats.load,
            stats.time_s,
            frozenset(stats.prefixes) if prefixes is None else prefixes,
            stats.pending,
            full,
            stats.short_request_tokens,
            stats.limits,
            stats.interactive_slo,
        )


def serving_lane(lane: Lane, cls: TrafficClass) -> Lane:
    if lane is not Lane.BOTH:
        return lane
    return Lane.LONG if cls is TrafficClass.LONG else Lane.CHAT
