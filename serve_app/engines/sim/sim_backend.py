"""`SimBackend`: the `EngineBackend` of a `sim` replica, orchestrating the engine loop, streams and prefix cache.

`respond` answers OpenAI requests through `serving` (validation, the prompt's count, OpenAI's response written
from `generate`'s chunks). Output text is synthetic; token counts, timings, queueing, prefix caching and the
scheduler are the simulated engine's.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator
from typing import Any

from scheduler.config import PolicyConfig
from scheduler.sim.engine import SimEngine
from scheduler.sim.presets import PRESETS
from scheduler.sim.request import Phase, SimRequest
from scheduler.sim.schedulers import PolicyScheduler
from serve_app.config import AppConfig, EngineKnobs, policy_config
from serve_app.engines.sim.generation import Chunk, GenerateRequest, RequestError
from serve_app.engines.sim.loop import EngineLoop
from serve_app.engines.sim.prefix_cache import SessionPrefixCache
from serve_app.engines.sim.serving import SimServing
from serve_app.engines.sim.stop import StopMatcher
from serve_app.engines.sim.streams import Streams, next_progress
from serve_app.engines.sim.synthetic_text import synthetic_text
from serve_app.protocol.openai_models import FinishReason
from serve_app.replica.backend import EngineCapacity, EngineCounters, OpenAIRequest, ReplicaLoad, ResponsePart
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
        self.scheduler = PolicyScheduler(
            policy_config(self._base_policy, knobs.policy), max_cut_requests=max_cut, pass_cost=self.preset.cost
        )
        self.engine = SimEngine(self.preset.cost, self.scheduler)
        self.streams = Streams()
        self.loop = EngineLoop(self.engine, self.streams, knobs.time_scale)
        self.cache = SessionPrefixCache(
            cfg.sim.chars_per_token, knobs.session_cache_sessions, self.preset.cost.kv_pool_tokens
        )
        self.serving = SimServing(
            self.model_id,
            ApproxTokenizer(cfg.sim.chars_per_token),
            cfg.context_limit_tokens,
            cfg.default_max_tokens,
            self.generate,
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
        self.loop.time_scale = knobs.time_scale
        self.cache.resize(knobs.session_cache_sessions)
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
    def respond(self, request: OpenAIRequest) -> AsyncGenerator[list[ResponsePart], None]:
        return self.serving.respond(request)

    def output_plan(self, max_tokens: int) -> tuple[int, FinishReason]:
        """How many tokens the answer has and why it ends: its natural length (`stop`) or `max_tokens` (`length`)."""
        natural = self.cfg.sim.natural_output_tokens
        return (max_tokens, "length") if max_tokens < natural else (natural, "stop")

    def _admit(self, request: GenerateRequest) -> SimRequest:
        if request.rid in self.streams:
            raise RuntimeError(f"request id {request.rid!r} is already running")  # ids are unique: a bug
        cached = min(self.cache.match(request.session_id, request.prompt_text), request.prompt_tokens - 1)
        num_output, _ = self.output_plan(request.max_tokens)
        sim_req = SimRequest(
            rid=request.rid,
            prompt_tokens=request.prompt_tokens,
            output_tokens=num_output,
            arrival_s=asyncio.get_running_loop().time(),
            traffic_class=request.traffic_class,
            cached_tokens=max(0, cached),
            session=request.session_id,
        )
        try:
            self.engine.add(sim_req)
        except ValueError as e:  # the engine's one refusal: the request can never fit in its KV pool
            raise RequestError(400, str(e)) from None
        return sim_req

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        sim_req = self._admit(request)
        queue = self.streams.open(request.rid)
        self.loop.wake()
        _, natural_reason = self.output_plan(request.max_tokens)
        stop = StopMatcher(request.stop)
        completed = False
        produced = 0
        output: list[str] = []
        cached_first: int | None = sim_req.cached_tokens  # reported with the first chunk
        try:
            while not completed:
                progress = await next_progress(queue)
                if progress.aborted:
                    return
                upto = produced if progress.num_generated is None else progress.num_generated
                finish: FinishReason | None = natural_reason if progress.finished else None
                text, stopped = stop.feed(synthetic_text(produced, upto))
                if stopped:
                    finish = "stop"
                    self.engine.abort(request.rid)  # the answer is complete: free its slot and KV now
                elif finish is not None:
                    text += stop.flush()
                num_new, produced = upto - produced, upto
                output.append(text)
                completed = finish is not None
                yield Chunk(text, num_new, cached_first, finish, produced)
                cached_first = None
        finally:
            self.streams.close(request.rid)
            if completed:
                self._counters.num_finished += 1
                context = request.prompt_text + "".join(output)
                self.cache.store(request.session_id, context, request.prompt_tokens + produced)
            elif self.engine.abort(request.rid):
                # Client went away (or the replica is stopping): free the queue slot and the KV now.
                self._counters.num_aborted += 1
                self.loop.wake()

    def abort(self, rid: str) -> bool:
        self.streams.abort(rid)
        aborted = self.engine.abort(rid)
        if aborted:
            self._counters.num_aborted += 1
            self.loop.wake()
        return aborted

    # -- views -----------------------------------------------------------------------------
    def load(self) -> ReplicaLoad:
        e, policy = self.engine, self.scheduler.cfg
        prefilling = [r for r in e.running if r.phase is Phase.PREFILLING]
        return ReplicaLoad(
            num_waiting=len(e.waiting),
            num_prefilling=len(prefilling),
            num_decoding=len(e.running) - len(prefilling),
            prefill_tokens=sum(r.extend_tokens for r in e.waiting) + sum(r.extend_tokens for r in prefilling),
            max_running_requests=self.scheduler.max_running_requests,
            kv_used_tokens=e.kv_used_tokens,
            kv_total_tokens=self.preset.cost.kv_pool_tokens,
            # The preset's cost in simulated seconds, as the policy's targets are.
            prefill_tok_per_s=self.preset.cost.prefill_tok_per_s,
            pass_fixed_s=self.preset.cost.fixed_s,
            pass_tokens=wait_pass_tokens(policy, policy.chunk_budget_tokens),
            wait_pass_s=wait_pass_seconds(policy),
            interactive_pass_tokens=interactive_pass_tokens(policy, policy.chunk_budget_tokens),
            short_first=overtakes_queued_prefill(policy),
        )

    def recent_sessions(self, limit: int) -> dict[str, int]:
        return self.cache.recent(limit)

    def pending_requests(self, limit: int) -> dict[str, int]:
        e = self.engine
        pending = [*(r for r in e.running if r.phase is Phase.PREFILLING), *e.waiting]
        return {r.rid: r.extend_tokens for r in pending[:limit]}

    def counters(self) -> EngineCounters:
        self._counters.num_skip_ahead = self.scheduler.planner.num_skip_ahead
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
            "num_cached_sessions": self.cache.num_sessions,
            "cached_tokens_total": self.cache.total_tokens,
            "counters": {
                "finished": self._counters.num_finished,
                "aborted": self._counters.num_aborted,
                "skip_ahead": self.scheduler.planner.num_skip_ahead,
            },
        }
