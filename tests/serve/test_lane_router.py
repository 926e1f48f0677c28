"""`LaneRouter` inside Serve's own routing loop (`RequestRouter._choose_replica_for_request`), with fake replicas:
no Ray cluster. What the pure policy decides is tested in test_routing; here, what Serve does with it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID, RequestMetadata
from ray.serve.request_router import PendingRequest

from serve_app.replica.backend import ReplicaLoad
from serve_app.routing.backpressure import BackpressureLimits, LanesFull, ShedReason
from serve_app.routing.lane_router import ROUTE_KWARG, LaneRouter
from serve_app.routing.records import Lane, RouteHint, RouteTicket, RoutingStats

DEPLOYMENT = DeploymentID(name="Engine", app_name="fairshare")
LIMITS = BackpressureLimits(max_ongoing_requests=8, max_queued_requests=2, max_queued_prefill_tokens=60_000)


@dataclass
class FakeReplica:
    """What `LaneRouter` and Serve's routing loop read of a replica before sending it anything."""

    unique_id: str
    lane: Lane
    load: ReplicaLoad
    max_ongoing_requests: int = 8
    replica_metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def replica_id(self) -> ReplicaID:
        return ReplicaID(self.unique_id, DEPLOYMENT)

    @property
    def routing_stats(self) -> dict[str, Any]:
        return RoutingStats(self.lane, self.load, 2048, 0.0, limits=LIMITS).to_dict()

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return 0  # Serve probes new replicas; below max_ongoing_requests, so never "full"


def three_lanes(long: ReplicaLoad, chat1: ReplicaLoad, chat2: ReplicaLoad) -> list[FakeReplica]:
    return [FakeReplica("L", Lane.LONG, long), FakeReplica("C1", Lane.CHAT, chat1), FakeReplica("C2", Lane.CHAT, chat2)]


def pending(tokens: int) -> PendingRequest:
    ticket = RouteTicket(RouteHint(session_id=None, prompt_tokens=tokens, request_id="chat-1"))
    metadata = RequestMetadata(request_id="r1", internal_request_id="i1", call_method="generate")
    return PendingRequest(args=[], kwargs={ROUTE_KWARG: ticket}, metadata=metadata)


def test_a_shed_request_fails_at_the_caller_and_serve_stops_routing_it() -> None:
    full = ReplicaLoad(num_waiting=2, prefill_tokens=60)
    replicas = three_lanes(full, full, full)

    async def scenario() -> tuple[LaneRouter, PendingRequest]:
        request = pending(30)  # its future belongs to this loop
        router = LaneRouter(DEPLOYMENT, DeploymentHandleSource.REPLICA)
        router.initialize_state()
        router.update_replicas(replicas)
        with pytest.raises(LanesFull) as e:
            await asyncio.wait_for(router._choose_replica_for_request(request), timeout=10)
        assert e.value.shed.status == 429 and e.value.shed.reason is ShedReason.QUEUED
        await asyncio.sleep(0.05)  # Serve's routing task sees the request done and retires
        return router, request

    router, request = asyncio.run(scenario())
    assert router.curr_num_routing_tasks == 0  # no routing task left retrying the request
    assert request.kwargs[ROUTE_KWARG].decision is None  # never sent: no decision recorded on the ticket


def test_a_replica_under_its_limits_is_the_one_serve_sends_to() -> None:
    full, idle = ReplicaLoad(num_waiting=2, prefill_tokens=60), ReplicaLoad()
    replicas = three_lanes(full, full, idle)

    async def scenario() -> tuple[Any, PendingRequest]:
        request = pending(30)
        router = LaneRouter(DEPLOYMENT, DeploymentHandleSource.REPLICA)
        router.initialize_state()
        router.update_replicas(replicas)
        return await asyncio.wait_for(router._choose_replica_for_request(request), timeout=10), request

    chosen, request = asyncio.run(scenario())
    assert chosen.unique_id == "C2" and request.kwargs[ROUTE_KWARG].decision.replica_id == "C2"


def test_a_loading_replica_gets_nothing_and_the_request_goes_out_once_one_is_up() -> None:
    loading = ReplicaLoad(ready=False)
    replicas = [FakeReplica("R1", Lane.BOTH, loading), FakeReplica("R2", Lane.BOTH, loading)]

    async def scenario() -> tuple[Any, PendingRequest, bool]:
        request = pending(30)
        router = LaneRouter(DEPLOYMENT, DeploymentHandleSource.REPLICA)
        router.initialize_state()
        router.update_replicas(replicas)
        choice = asyncio.ensure_future(router._choose_replica_for_request(request))
        await asyncio.sleep(0.5)
        waited = not choice.done()  # no replica is ready: Serve's loop keeps asking, nothing is sent
        replicas[1].load = ReplicaLoad()  # R2's engine is up
        return await asyncio.wait_for(choice, timeout=10), request, waited

    chosen, request, waited = asyncio.run(scenario())
    assert waited and chosen.unique_id == "R2" and request.kwargs[ROUTE_KWARG].decision.replica_id == "R2"
