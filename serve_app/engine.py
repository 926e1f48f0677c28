"""The engine replica deployment: one engine (sim or sglang) per replica, one lane per replica.

A replica's lane follows its Serve rank: ranks below `long_lane_replicas` serve long documents,
the others chats; a lone replica serves both. It publishes lane, load and recently cached
sessions through `record_routing_stats`, which Serve forwards to every `LaneRouter`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from serve_app.config import AppConfig, EngineKnobs, validate
from serve_app.engine_backend import EngineBackend, GenerateRequest
from serve_app.metrics import EngineMetrics
from serve_app.routing import Lane, RouteDecision, RouteHint, TrafficClass, serving_lane

logger = logging.getLogger(__name__)

PUBLISHED_PENDING = 256
"""Most pending request ids a replica publishes (routers correct stale loads with them)."""


def lane_for(rank: int, world_size: int, long_lane_replicas: int) -> Lane:
    if world_size <= 1:
        return Lane.BOTH
    return Lane.LONG if rank < long_lane_replicas else Lane.CHAT


def make_backend(cfg: AppConfig, knobs: EngineKnobs) -> EngineBackend:
    # Imported here: the sglang backend imports sglang, which only GPU machines have.
    if cfg.backend == "sim":
        from serve_app.sim_backend import SimBackend

        return SimBackend(cfg, knobs)
    from serve_app.sglang_backend import SglangBackend

    return SglangBackend(cfg, knobs)


@serve.deployment(name="Engine")
class Engine:
    def __init__(self, app_config: dict[str, Any]) -> None:
        self.cfg: AppConfig = validate(AppConfig, app_config, "args")
        self.knobs = EngineKnobs()
        self.backend = make_backend(self.cfg, self.knobs)
        ctx = serve.get_replica_context()
        self.replica_id = ctx.replica_tag
        self._started = False
        self._metrics = EngineMetrics()
        self.started_at_s = time.time()

    # -- Serve hooks -----------------------------------------------------------------------
    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        knobs: EngineKnobs = validate(EngineKnobs, user_config, "Engine.user_config")
        await self._ensure_started()
        self.backend.reconfigure(knobs)
        self.knobs = knobs
        logger.info("replica %s: lane=%s knobs=%s", self.replica_id, self.lane.value, knobs.model_dump())

    async def _ensure_started(self) -> None:
        if not self._started:
            await self.backend.start()
            self._started = True

    @property
    def lane(self) -> Lane:
        ctx = serve.get_replica_context()
        return lane_for(ctx.rank.rank, ctx.world_size, self.knobs.long_lane_replicas)

    def record_routing_stats(self) -> dict[str, Any]:
        load = self.backend.load()
        lane = self.lane
        self._metrics.publish(lane.value, load, self.backend.counters())
        return {
            "lane": lane.value,
            "load": load.to_dict(),
            "time_s": time.time(),
            "sessions": self.backend.recent_sessions(self.knobs.published_sessions),
            "pending": self.backend.pending_requests(PUBLISHED_PENDING),
        }

    def record_replica_metadata(self) -> dict[str, Any]:
        return {"lane": self.lane.value}

    async def check_health(self) -> None:
        await self._ensure_started()

    async def __del__(self) -> None:
        with contextlib.suppress(Exception):
            await self.backend.shutdown()

    # -- requests --------------------------------------------------------------------------
    async def generate(
        self, request: GenerateRequest, route: RouteDecision | RouteHint | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream of plain dicts `{"text", "n" (output tokens so far), "start"? (first: routing and cache),
        "finish"? (last: finish reason)}`, or one `{"error": {...}}`."""
        await self._ensure_started()
        if isinstance(route, RouteDecision):
            lane, cls, reason = route.lane.value, route.traffic_class.value, route.reason.value
        else:
            cls = request.traffic_class
            lane, reason = serving_lane(self.lane, TrafficClass(cls)).value, "unrouted"
        if cls != request.traffic_class:
            request = _with_class(request, cls)
        start = {"replica": self.replica_id, "lane": lane, "traffic_class": cls, "reason": reason}
        try:
            gen = self.backend.generate(request)
            async with contextlib.aclosing(gen):
                async for chunk in gen:
                    item: dict[str, Any] = {"text": chunk.text, "n": chunk.completion_tokens}
                    if chunk.cached_tokens is not None:
                        item["start"] = {**start, "cached_tokens": chunk.cached_tokens}
                    if chunk.finish_reason is not None:
                        item["finish"] = chunk.finish_reason
                    yield item
        except ValueError as e:
            # The engine refused the request itself (e.g. it can never fit in KV): a client error.
            yield {"error": {"status": 400, "message": str(e)}}

    async def describe(self, route: RouteDecision | RouteHint | None = None) -> dict[str, Any]:
        """Admin view of this replica (reach a given replica with `RouteHint(target_replica=...)`)."""
        return {
            "replica": self.replica_id,
            "lane": self.lane.value,
            "started_at_s": self.started_at_s,
            "knobs": self.knobs.model_dump(),
            "load": self.backend.load().to_dict(),
            **self.backend.describe(),
        }


def _with_class(request: GenerateRequest, cls: str) -> GenerateRequest:
    return dataclasses.replace(request, traffic_class=cls)
