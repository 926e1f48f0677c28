"""`SimBackend`: the `EngineBackend` of a `sim` replica, orchestrating the engine loop, streams and prefix cache.

`respond` answers OpenAI requests through `serving` (validation, the prompt's count, OpenAI's response written
from the chunks `generation.SimGenerator` streams): backend -> serving -> generator, never back. Output text is
synthetic; token counts, timings, queueing, prefix caching and the scheduler are the simulated engine's.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncGenerator
from typing import Any

from scheduler.config import PolicyConfig
from scheduler.sim.engine import SimEngine
from scheduler.sim.presets import PRESETS
from scheduler.sim.request import Phase
from scheduler.sim.schedulers import PolicyScheduler
from serve_app.config import AppConfig, EngineKnobs, policy_config
from serve_app.engines.sim.generation import SimGenerator
from serve_app.engines.sim.loop import EngineLoop, WallClockCost
from serve_app.engines.sim.prefix_cache import PrefixCache
from serve_app.engines.sim.serving import SimServing
from serve_app.engines.sim.streams import Streams
from serve_app.replica.backend import EngineCapacity, EngineCounters, OpenAIRequest, ReplicaLoad, ResponsePart
from serve_app.replica.held_prefixes import HeldPrefixes
from serve_app.routing.ttft_prediction import (
    interactive_pass_tokens,
    overtakes_queued_prefill,
    wait_pass_seconds,
    wait_pass_tokens,
)
from serve_app.tokenizer import ApproxTokenizer

logger = logging.getLogger(__name__)


class SimBackend:
    def __init__(self, cfg: AppConfig, knobs: EngineKnobs) -> None:
        self.cfg = cfg
        self.model_id = cfg.served_model_id
        self.preset = PRESETS[cfg.sim.preset]
        self._base_policy, max_cut = cfg.sim.base_policy()
        self._counters = EngineCounters()
        policy = policy_config(self._base_policy, knobs.policy)
        self.wall_cost = WallClockCost(self.preset.cost, policy.pass_overrun_quantile)
        self.scheduler = PolicyScheduler(policy, max_cut_requests=max_cut, pass_cost=self.wall_cost)
        self.engine = SimEngine(self.preset.cost, self.scheduler)
        self.streams = Streams()
        self.loop = EngineLoop(self.engine, self.streams, knobs.time_scale, self.wall_cost.overruns)
        self.cache = PrefixCache(self.preset.cost.kv_pool_tokens)
        self.held = HeldPrefixes()
        self._arriving: dict[str, int] = {}
        """Requests the replica passed to this backend that its engine has not taken yet: their uncached tokens."""
        tokenizer = ApproxTokenizer(cfg.sim.chars_per_token)
        self.generator = SimGenerator(
            self.engine,
            self.loop,
            self.streams,
            self.cache,
            tokenizer.extended_ids,
            self._counters,
            cfg.sim.natural_output_tokens,
        )
        self.serving = SimServing(
            self.model_id,
            tokenizer,
            cfg.context_limit_tokens,
            cfg.default_max_tokens,
            self.generator.generate,
        )

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self.loop.start()

    async def shutdown(self) -> None:
        await self.loop.stop()

    async def restart_if_needed(self) -> bool:
        return False  # the simulated engine takes every knob live

    def reconfigure(self, knobs: EngineKnobs) -> None:
        cfg = policy_config(self._base_policy, knobs.policy)  # raises ConfigError; nothing changed yet
        self.scheduler.reconfigure(cfg)
        self.wall_cost.overruns.quantile = cfg.pass_overrun_quantile
        self.loop.time_scale = knobs.time_scale
        logger.info("sim engine reconfigured: time_scale=%s %s", knobs.time_scale, cfg.describe_cap())

    @property
    def policy(self) -> PolicyConfig:
        return self.scheduler.cfg

    @property
    def time_scale(self) -> float:
        return self.loop.time_scale

    def capacity(self) -> EngineCapacity:
        rate = self.preset.cost.prefill_tok_per_s
        # The simulated engine drains at its rate scaled to wall time: Retry-After is in wall seconds.
        wall_rate = rate / self.time_scale if self.time_scale > 0 else None
        context = self.cfg.context_limit_tokens or self.preset.cost.kv_pool_tokens
        return EngineCapacity(context, prefill_tokens_per_s=rate, wall_prefill_tokens_per_s=wall_rate)

    # -- requests --------------------------------------------------------------------------
    async def respond(self, request: OpenAIRequest) -> AsyncGenerator[list[ResponsePart], None]:
        # Until the engine has it, the request is in the load the replica checks its limits on: a long prompt is
        # tokenized and hashed off the event loop first, and another request's check may run meanwhile.
        self._arriving[request.rid] = request.uncached_tokens
        try:
            async with contextlib.aclosing(self.serving.respond(request)) as parts:
                async for batch in parts:
                    yield batch
        finally:
            self._arriving.pop(request.rid, None)

    # -- views -----------------------------------------------------------------------------
    def load(self) -> ReplicaLoad:
        e, policy, planner = self.engine, self.scheduler.cfg, self.scheduler.planner
        prefilling = [r for r in e.running if r.phase is Phase.PREFILLING]
        arriving = [tokens for rid, tokens in self._arriving.items() if rid not in self.streams]
        # The sizer's own bound, on its cost model; the simulator plans no pass before it sees an arrival (its
        # snapshots count no admission or output lag).
        own_pass_s = planner.sizer.slo.arrival_own_pass_s(planner.pass_cost)
        return ReplicaLoad(
            num_waiting=len(e.waiting) + len(arriving),
            num_prefilling=len(prefilling),
            num_decoding=len(e.running) - len(prefilling),
            prefill_tokens=sum(r.extend_tokens for r in (*e.waiting, *prefilling)) + sum(arriving),
            max_running_requests=self.scheduler.max_running_requests,
            kv_used_tokens=e.kv_used_tokens,
            kv_total_tokens=self.preset.cost.kv_pool_tokens,
            # The preset's cost in simulated seconds, as the policy's targets are.
            prefill_tok_per_s=self.preset.cost.prefill_tok_per_s,
            pass_fixed_s=self.preset.cost.fixed_s,
            pass_tokens=wait_pass_tokens(policy, policy.chunk_budget_tokens),
            wait_pass_s=wait_pass_seconds(policy, own_pass_s, admission_lag_passes=0, output_lag_passes=0),
            interactive_pass_tokens=interactive_pass_tokens(policy, policy.chunk_budget_tokens),
            short_first=overtakes_queued_prefill(policy),
        )

    def held_prefixes(self, limit: int) -> list[int]:
        self.held.apply(self.cache.take_events())
        return self.held.published(limit)

    def pending_requests(self, limit: int) -> dict[str, int]:
        e = self.engine
        pending = [*(r for r in e.running if r.phase is Phase.PREFILLING), *e.waiting]
        return {r.rid: r.extend_tokens for r in pending[:limit]}

    def counters(self) -> EngineCounters:
        planner = self.scheduler.planner
        self._counters.num_skip_ahead = planner.num_skip_ahead
        self._counters.sized_passes = planner.slo_counters.sized_passes
        self._counters.passes_over_target = {t.value: n for t, n in planner.slo_counters.missed_passes.items()}
        return self._counters

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "sim",
            "preset": self.preset.name,
            "pid": os.getpid(),
            "time_scale": self.time_scale,
            "policy": self.scheduler.cfg.model_dump(),
            "active_request_ids": [r.rid for r in (*self.engine.waiting, *self.engine.running)],
            "kv_used_tokens": self.engine.kv_used_tokens,
            "num_passes": self.engine.num_passes,
            "num_passes_by_kind": dict(self.loop.num_passes_by_kind),
            "cached_tokens_total": self.cache.total_tokens,
            "counters": {
                "finished": self._counters.num_finished,
                "aborted": self._counters.num_aborted,
                "skip_ahead": self.scheduler.planner.num_skip_ahead,
            },
        }
