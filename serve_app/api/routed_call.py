"""One request on its way through the ingress: its session, its tenant, its route once decided, its timing, and the
headers that tell the client about them."""

from __future__ import annotations

import time

from scheduler.slo import NOT_JUDGED, SloTargets
from scheduler.tenants import DEFAULT_TENANT
from serve_app.routing.records import RouteDecision, RouteTicket
from serve_app.tenants.tenancy import TENANT_HEADER


class RoutedCall:
    def __init__(self, session_id: str | None, received_s: float, tenant: str = DEFAULT_TENANT) -> None:
        self.session_id = session_id
        self.received_s = received_s
        self.tenant = tenant
        """`time.perf_counter()` at receipt."""
        self.decision: RouteDecision | None = None
        self.routed_s: float | None = None
        self.first_item_s: float | None = None

    @property
    def lane(self) -> str:
        return self.decision.lane.value if self.decision else ""

    @property
    def traffic_class(self) -> str:
        return self.decision.traffic_class.value if self.decision else ""

    @property
    def slo(self) -> SloTargets:
        """The targets the request is judged by: its class's on the replica that serves it."""
        return self.decision.slo if self.decision else NOT_JUDGED

    def routed(self, ticket: RouteTicket) -> None:
        """The engine's first item arrived, on the route `ticket` records."""
        self.decision, self.routed_s = ticket.decision, ticket.decided_at_s
        self.first_item_s = time.perf_counter()

    def server_timing(self) -> str:
        """`route`: receipt to the router's decision (tokenizing, routing). `ttft`: receipt to the engine's first
        item (also the handle hop and the engine's work until it: with a zero-cost engine, the serving overhead).
        The first item of a stream carries its first events; a whole response comes as one item."""
        parts = []
        if self.routed_s is not None:
            parts.append(f"route;dur={(self.routed_s - self.received_s) * 1000:.3f}")
        if self.first_item_s is not None:
            parts.append(f"ttft;dur={(self.first_item_s - self.received_s) * 1000:.3f}")
        return ", ".join(parts)

    def headers(self) -> dict[str, str]:
        d = self.decision
        headers = {
            "X-Lane": self.lane,
            "X-Replica": d.replica_id if d else "",
            "X-Route": d.reason.value if d else "",
            "X-Traffic-Class": self.traffic_class,
            TENANT_HEADER: self.tenant,
            "Server-Timing": self.server_timing(),
        }
        if self.session_id:  # echoed where the client named one
            headers["X-Session-ID"] = self.session_id
        return headers
