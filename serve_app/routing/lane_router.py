"""`LanePolicy` as a Ray Serve request router (`request_router_config.request_router_class`).

Serve runs one router per handle, in the caller's process: here, inside each ingress replica, for
its handle to the `Engine` deployment. Each request's `route` kwarg is the ingress's `RouteTicket`;
the router records its `RouteDecision` on it before Serve sends the request, so the ingress reads
lane, class and reason from its own ticket and the replica receives them with the request.

`choose_replicas` returns one rank holding one replica: the policy has already weighed load and
affinity. If that replica is at Serve's `max_ongoing_requests`, Serve backs off and asks again,
and the policy (which sees the replica as full) chooses anew. A replica whose engine is not ready gets
nothing: with none ready the router returns no rank, and Serve backs off and asks again.

When the policy sheds the request (every replica its lanes allow is over a backpressure limit), the
router fails the request's pending future with `LanesFull`: Serve hands that exception to the caller
of the handle (the ingress answers 429) and stops routing the request, which never reaches a replica.

A replica lost (its node gone, its process dead) is out of the choices at once: Serve tells the router through
`on_replica_actor_died` and `on_replica_actor_unavailable` when a call or a probe to it fails (over gRPC, a dead
replica's calls fail as unavailable). Serve's own handling of these does not last: the controller's replica list,
which notices a dead node only after the GCS's health checks, is sent again meanwhile and brings the replica back.
So the router keeps its own lost set, and drops a mark when the controller's list no longer has the replica (it
was replaced) or after `LOST_MARK_S` (a replica only briefly unreachable comes back; if it is still dead, the
next call to it fails and marks it again).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from serve_app import metrics
from serve_app.routing.backpressure import LanesFull, Shed
from serve_app.routing.lane_policy import LanePolicy
from serve_app.routing.records import Lane, ReplicaView, RouteHint, RouteTicket, RoutingStats

logger = logging.getLogger(__name__)

ROUTE_KWARG = "route"
LOST_MARK_S = 30.0
"""Longest a replica stays out of the choices while the controller still lists it: longer than Ray takes to find a
dead node (its health checks, ~15 s) and the controller to drop its replicas."""


class LaneRouter(RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        self.policy = LanePolicy()
        self._metrics = metrics.RouterMetrics()
        self._prefixes: dict[str, tuple[float, frozenset[int]]] = {}
        """Replica -> its last publication's time and prefix pages as a set (built once per publication)."""
        self._lost: dict[str, float] = {}
        """Replica -> when a call to it failed as lost (`time.monotonic()`): none of its choices until the mark goes."""

    def _ensure_state(self) -> None:
        # `initialize_state` is Serve's hook; keep working if a Serve version skips it.
        if not hasattr(self, "policy"):
            self.initialize_state()

    def _view(self, replica: RunningReplica) -> ReplicaView:
        # Before its first stats arrive, a replica's lane comes from the metadata it gave at start.
        lane = Lane(replica.replica_metadata.get("lane") or Lane.BOTH.value)
        stats = RoutingStats.from_dict(replica.routing_stats, lane)
        queue_len = self.replica_queue_len_cache.get(replica.replica_id)
        full = queue_len is not None and queue_len >= replica.max_ongoing_requests
        rid = replica.replica_id.unique_id
        known = self._prefixes.get(rid)
        if known is None or known[0] != stats.time_s:
            known = self._prefixes[rid] = (stats.time_s, frozenset(stats.prefixes))
        return ReplicaView.from_stats(rid, stats, full, known[1])

    # -- lost replicas: Serve's hooks, and the controller's list ---------------------------------
    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        self._mark_lost(replica_id)
        super().on_replica_actor_died(replica_id)

    def on_replica_actor_unavailable(self, replica_id: ReplicaID) -> None:
        self._mark_lost(replica_id)
        super().on_replica_actor_unavailable(replica_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        self._ensure_state()
        listed = {r.replica_id.unique_id for r in replicas}
        for replaced in self._lost.keys() - listed:
            del self._lost[replaced]
        super().update_replicas(replicas)

    def _mark_lost(self, replica_id: ReplicaID) -> None:
        self._ensure_state()
        if replica_id.unique_id not in self._lost:
            logger.warning("engine replica %s lost: routing around it", replica_id.unique_id)
        self._lost[replica_id.unique_id] = time.monotonic()

    def _live(self, candidates: list[RunningReplica]) -> list[RunningReplica]:
        """`candidates` less the replicas marked lost (marks older than `LOST_MARK_S` dropped first)."""
        if not self._lost:
            return candidates
        now = time.monotonic()
        for rid in [rid for rid, at in self._lost.items() if now - at > LOST_MARK_S]:
            del self._lost[rid]
        return [r for r in candidates if r.replica_id.unique_id not in self._lost]

    # -- choosing --------------------------------------------------------------------------------
    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        self._ensure_state()
        if pending_request is not None:
            # Serve's loop asks again at once unless told to back off (its locality mixins set this; we have none):
            # without it, a request no replica may take yet (all loading or lost, or the chosen one full) spins a core.
            pending_request.routing_context.should_backoff = True
        candidate_replicas = self._live(candidate_replicas)
        if not candidate_replicas:
            return []
        if pending_request is None:
            return [candidate_replicas]
        ticket = pending_request.kwargs.get(ROUTE_KWARG)
        hint: RouteHint | None = ticket.hint if isinstance(ticket, RouteTicket) else None
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        for gone in self._prefixes.keys() - by_id.keys():
            del self._prefixes[gone]
        decision = self.policy.decide(
            pending_request.metadata.internal_request_id,
            hint,
            [self._view(r) for r in candidate_replicas],
            time.time(),
        )
        if decision is None:
            return []
        if isinstance(decision, Shed):
            return self._shed(pending_request, decision, candidate_replicas)
        if isinstance(ticket, RouteTicket):
            ticket.record(decision, time.perf_counter())
        self._metrics.on_decision(decision)
        return [[by_id[decision.replica_id]]]

    def _shed(
        self, pending_request: PendingRequest, shed: Shed, candidate_replicas: list[RunningReplica]
    ) -> list[list[RunningReplica]]:
        if not pending_request.future.done():
            pending_request.future.set_exception(LanesFull(shed))
        # Serve's routing loop sees the request's future done when it gets a candidate, and stops there
        # without sending it (returning none would make it back off and ask again).
        return [candidate_replicas[:1]]

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._ensure_state()
        self.policy.on_completed(internal_request_id, time.time())
