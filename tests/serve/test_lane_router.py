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
from serve_app.routing import lane_router
from serve_app.routing.backpressure import BackpressureLimits, LanesFull, ShedReason
from serve_app.routing.lane_router import ROUTE_KWARG, LaneRouter
from serve_app.routing.records import Lane, RouteHint, RouteTicket, RoutingStats

DEPLOYMENT = DeploymentID(name="Engine", app_name="fairshare")
LIMITS = BackpressureLimits(max_queued_requests=2, max_queued_prefill_tokens=60_000)


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


def request(n: int) -> PendingRequest:
    ticket = RouteTicket(RouteHint(session_id="s", prompt_tokens=30, request_id=f"chat-{n}"))
    metadata = RequestMetadata(request_id=f"r{n}", internal_request_id=f"i{n}", call_method="respond")
    return PendingRequest(args=[], kwargs={ROUTE_KWARG: ticket}, metadata=metadata)


def lost_and_live() -> list[FakeReplica]:
    """R1 idle (the policy's choice while it is there), R2 decoding."""
    return [FakeReplica("R1", Lane.BOTH, ReplicaLoad()), FakeReplica("R2", Lane.BOTH, ReplicaLoad(num_decoding=6))]


async def choices(router: LaneRouter, n: int, first: int = 0) -> list[str]:
    return [(await asyncio.wait_for(router._choose_replica_for_request(request(first + i)), 10)).unique_id
            for i in range(n)]  # fmt: skip


@pytest.mark.parametrize("hook", ["on_replica_actor_unavailable", "on_replica_actor_died"])
def test_a_lost_replica_is_out_of_the_choices_at_once_until_the_controller_drops_it(hook: str) -> None:
    """Serve's hook marks it; the controller's list, sent again before the controller noticed, does not bring it
    back; once the list no longer has it (replaced), the mark goes."""
    r1, r2 = lost_and_live()

    async def scenario() -> tuple[list[str], list[str], set[str], set[str]]:
        router = LaneRouter(DEPLOYMENT, DeploymentHandleSource.REPLICA)
        router.initialize_state()
        router.update_replicas([r1, r2])
        before = await choices(router, 1)
        getattr(router, hook)(r1.replica_id)
        router.update_replicas([r1, r2])  # a stale list: the controller has not noticed yet
        after = await choices(router, 3, first=1)
        marked = set(router._lost)
        router.update_replicas([r2])
        return before, after, marked, set(router._lost)

    before, after, marked, left = asyncio.run(scenario())
    assert before == ["R1"] and after == ["R2", "R2", "R2"]
    assert marked == {"R1"} and left == set()


def test_a_lost_mark_lapses_for_a_replica_the_controller_still_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica only briefly unreachable comes back after LOST_MARK_S (if it is dead, its next call marks it again)."""
    monkeypatch.setattr(lane_router, "LOST_MARK_S", -1.0)  # every mark already old
    r1, r2 = lost_and_live()

    async def scenario() -> list[str]:
        router = LaneRouter(DEPLOYMENT, DeploymentHandleSource.REPLICA)
        router.initialize_state()
        router.update_replicas([r1, r2])
        router.on_replica_actor_unavailable(r1.replica_id)
        return await choices(router, 1)

    assert asyncio.run(scenario()) == ["R1"]
