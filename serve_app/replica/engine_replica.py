"""The engine replica deployment: one engine (sim or sglang) per replica, one lane per replica.

By default every replica serves both lanes and the router gives each request the role the load needs
(`serve_app.routing.lane_policy`); with static lanes (`long_lane_replicas` set) a replica's lane follows its Serve rank:
ranks below it serve long documents, the others chats; a lone replica serves both. It publishes lane, load
(with its pass cost and whether its engine is ready), the prefixes its engine holds and its TTFT target through
`record_routing_stats`, which Serve forwards to every `LaneRouter`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ray import serve

from scheduler.config import PolicyConfig
from scheduler.slo import NOT_JUDGED, SloTargets
from scheduler.tenants import DEFAULT_TENANT
from serve_app.api.request_log import configure_logging
from serve_app.autoscaling.signals import replica_signals
from serve_app.config import AppConfig, EngineKnobs, validate
from serve_app.metrics import EngineMetrics, TenantLabels
from serve_app.protocol.sse import TEXT_FIELDS
from serve_app.replica.backend import (
    EngineBackend,
    EngineCapacity,
    EngineError,
    OpenAIRequest,
    ReplicaLoad,
    ResponseItem,
    ResponsePart,
    carries_output,
    joined_bodies,
)
from serve_app.replica.chat_slo import ChatJudge, RecentAttainment
from serve_app.replica.pacing import paced
from serve_app.routing.backpressure import Admit, BackpressureLimits, decide, derive_limits
from serve_app.routing.records import PUBLISHED_PENDING, Lane, RouteTicket, RoutingStats

logger = logging.getLogger(__name__)


def lane_for(rank: int, world_size: int, long_lane_replicas: int | None) -> Lane:
    if world_size <= 1 or long_lane_replicas is None:
        return Lane.BOTH
    return Lane.LONG if rank < long_lane_replicas else Lane.CHAT


def backpressure_limits(capacity: EngineCapacity, knobs: EngineKnobs, policy: PolicyConfig) -> BackpressureLimits:
    """This replica's limits: derived from its engine's capacity and the deployment's knobs, with the
    user_config's overrides (requests in flight are Serve's own limit, `max_ongoing_requests`)."""
    limits = derive_limits(
        prefill_concurrency=policy.prefill_concurrency,
        context_limit_tokens=capacity.context_limit_tokens,
        prefill_tokens_per_s=capacity.prefill_tokens_per_s,
    )
    overrides: dict[str, Any] = {"prefill_tokens_per_s": capacity.wall_prefill_tokens_per_s}
    if knobs.max_queued_requests is not None:
        overrides["max_queued_requests"] = knobs.max_queued_requests
    if knobs.max_queued_prefill_tokens is not None:
        overrides["max_queued_prefill_tokens"] = knobs.max_queued_prefill_tokens
    return limits.model_copy(update=overrides)


def make_backend(cfg: AppConfig, knobs: EngineKnobs) -> EngineBackend:
    # Imported here: the sglang backend imports sglang, which only GPU machines have.
    if cfg.backend == "sim":
        from serve_app.engines.sim.sim_backend import SimBackend

        return SimBackend(cfg, knobs)
    from serve_app.engines.sglang.sglang_backend import SglangBackend

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
        self._metrics = EngineMetrics(TenantLabels(self.cfg.tenant_metric_labels))
        self._tenants: dict[str, str] = {}
        """Request id -> tenant, for the requests this replica serves (its queued tokens are published by tenant)."""
        self._admitted: dict[str, int] = {}
        """Request id -> uncached tokens, for requests admitted here whose stream has not started: the backend counts a
        request from its stream's first step, a loop turn after the admission, and a request arriving in between
        must see it (`admission_load`)."""
        self._chat_slo = RecentAttainment()
        """The verdicts of this replica's latest chats (`chat_slo`), published as `chat_slo_attainment`."""
        self.started_at_s = time.time()
        self.limits = BackpressureLimits()
        self._limits_policy: PolicyConfig | None = None
        configure_logging()

    # -- Serve hooks -----------------------------------------------------------------------
    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        knobs: EngineKnobs = validate(EngineKnobs, user_config, "Engine.user_config")
        # Knobs first, then start: a backend that reads its policy once at start (sglang) gets this one.
        self.backend.reconfigure(knobs)
        if await self.backend.restart_if_needed():
            logger.warning("replica %s: engine restarted for the new policy", self.replica_id)
        self.knobs = knobs
        self._size_limits()
        await self._ensure_started()
        logger.info("replica %s: lane=%s knobs=%s", self.replica_id, self.lane.value, knobs.model_dump())

    async def _ensure_started(self) -> None:
        if not self._started:
            await self.backend.start()
            self._started = True

    @property
    def lane(self) -> Lane:
        ctx = serve.get_replica_context()
        return lane_for(ctx.rank.rank, ctx.world_size, self.knobs.long_lane_replicas)

    def _size_limits(self) -> None:
        """Size the backpressure limits for the policy in force (sglang's plugin reports the values it filled from
        sglang's own, once its engine runs: the limits follow)."""
        policy = self.backend.policy
        self.limits = backpressure_limits(self.backend.capacity(), self.knobs, policy)
        self._limits_policy = policy

    def record_routing_stats(self) -> dict[str, Any]:
        policy = self.backend.policy
        if policy is not self._limits_policy:
            self._size_limits()
        stats = RoutingStats(
            lane=self.lane,
            load=self.engine_load(),
            short_request_tokens=policy.short_request_tokens,
            time_s=time.time(),
            prefixes=self.backend.held_prefixes(self.knobs.published_prefix_pages),
            pending=self.backend.pending_requests(PUBLISHED_PENDING),
            limits=self.limits,
            interactive_slo=SloTargets(ttft_s=policy.ttft_target_s, tbt_s=policy.tbt_target_s),
        )
        self._metrics.publish(stats.lane.value, stats.load, self.backend.counters())
        self._metrics.publish_tenants(stats.lane.value, queued_by_tenant(stats.pending, self._tenants))
        return stats.to_dict()

    def record_autoscaling_stats(self) -> dict[str, float]:
        """What the SLO autoscaling policy decides on (`serve_app.autoscaling`); nothing while the engine loads, so the
        policy counts this replica as capacity still coming."""
        signals = replica_signals(self.engine_load(), self.backend.policy, self._chat_slo.share(time.monotonic()))
        return signals.to_metrics() if signals is not None else {}

    def record_replica_metadata(self) -> dict[str, Any]:
        return {"lane": self.lane.value}

    async def check_health(self) -> None:
        await self._ensure_started()

    async def __del__(self) -> None:
        with contextlib.suppress(Exception):
            await self.backend.shutdown()

    # -- requests --------------------------------------------------------------------------
    async def respond(
        self, request: OpenAIRequest, route: RouteTicket | None = None
    ) -> AsyncIterator[Sequence[ResponseItem]]:
        """The backend's OpenAI response to `request`, relayed as it comes: after the first bytes, what comes faster
        than `stream_spacing_s` is held (`pacing`), and each stream item carries what is ready together as one body
        (`joined_bodies`: the only place a stream is coalesced). Backpressure first: over a limit, one `EngineError`
        (429) and nothing reaches the engine."""
        received_s = time.perf_counter()
        await self._ensure_started()
        decision = route.decision if route is not None else None
        if decision is not None:
            request = request.routed_as(decision.traffic_class, decision.uncached_tokens)
        admission = decide({self.replica_id: self.admission_load()}, request.uncached_tokens, self.limits)
        if not isinstance(admission, Admit):
            # Over a limit: a 429 now, rather than a queue the client waits in until it times out.
            yield [EngineError(admission.status, admission.message, admission.code, admission.retry_after_s)]
            return
        self._admitted[request.rid] = request.uncached_tokens
        text_field = TEXT_FIELDS[request.kind]  # the spacing starts at the first output, never at a chat's opening
        parts = paced(
            self._engine_stream(request), self.knobs.stream_spacing_s, lambda batch: carries_output(batch, text_field)
        )
        self._tenants[request.rid] = request.tenant
        # Judged by the targets the router gave it, as the ingress judges it (documents: none).
        judge = ChatJudge(request.kind, decision.slo, received_s) if decision and decision.slo != NOT_JUDGED else None
        try:
            async with contextlib.aclosing(parts):
                async for batch in parts:
                    # The one place a stream is coalesced: what is ready together crosses to the ingress as one body.
                    items = joined_bodies(batch)
                    if judge is not None:
                        judge.sent(items, time.perf_counter())
                    yield items
            if judge is not None and (met := judge.verdict()) is not None:
                self._chat_slo.add(met, time.monotonic())
        finally:
            self._tenants.pop(request.rid, None)
            self._admitted.pop(request.rid, None)  # closed before its stream started

    def engine_load(self) -> ReplicaLoad:
        """The backend's load, none of it requests while this replica has none open: its engine serves no one else,
        and a reading taken while the last request decoded counts it until the next reading (routers would predict a
        decode pass there that is not coming)."""
        load = self.backend.load()
        return load if self._tenants or self._admitted else load.without_requests()

    def admission_load(self) -> ReplicaLoad:
        """The backend's load and the requests admitted here that it does not count yet, as waiting."""
        load = self.engine_load()
        if not self._admitted:
            return load
        return replace(
            load,
            num_waiting=load.num_waiting + len(self._admitted),
            prefill_tokens=load.prefill_tokens + sum(self._admitted.values()),
        )

    async def _engine_stream(self, request: OpenAIRequest) -> AsyncGenerator[list[ResponsePart], None]:
        """The backend's stream of `request`. Its first step hands the request from `_admitted` to the backend,
        which counts it in its load from its own first step, run in the same turn of the loop."""
        self._admitted.pop(request.rid, None)
        async with contextlib.aclosing(self.backend.respond(request)) as source:
            async for batch in source:
                yield batch

    async def describe(self, route: RouteTicket | None = None) -> dict[str, Any]:
        """Admin view of this replica (reach a given replica with a ticket whose hint names `target_replica`)."""
        return {
            "replica": self.replica_id,
            "lane": self.lane.value,
            "started_at_s": self.started_at_s,
            "knobs": self.knobs.model_dump(),
            "load": self.engine_load().to_dict(),
            **self.backend.describe(),
        }


def queued_by_tenant(pending: Mapping[str, int], tenants: Mapping[str, str]) -> dict[str, int]:
    """Pending requests' tokens still to prefill (request id -> tokens), summed by the tenant of each."""
    out: dict[str, int] = {}
    for rid, tokens in pending.items():
        tenant = tenants.get(rid, DEFAULT_TENANT)
        out[tenant] = out.get(tenant, 0) + tokens
    return out
