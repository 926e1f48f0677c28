"""The `sim` backend: the simulator's engine (the same policy core as the sglang plugin) in real time.

One asyncio task per replica runs the engine loop, schedule -> execute -> update:
`engine.step(now)` decides and books a pass, the task sleeps for the pass's simulated duration
times `time_scale` (a pass in flight cannot be interrupted, as on a GPU), then hands the tokens
of that pass to the streams waiting for them. With nothing to run it waits for an arrival.

Prefix cache: a session's last context (prompt + answer) stays cached on the replica as chained
block hashes; a new prompt of the session is matched block by block, so the cached count is real
prefix reuse, not an assumption. The cache is LRU, bounded in sessions and by the KV pool.
Output text is synthetic; token counts and timings are the engine's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from scheduler.interleave import PassKind
from scheduler.sim.engine import SimEngine, StepResult
from scheduler.sim.presets import PRESETS
from scheduler.sim.request import Phase, SimRequest, TrafficClass
from scheduler.sim.schedulers import PolicyScheduler
from serve_app.config import AppConfig, EngineKnobs, policy_config, sim_base_policy
from serve_app.engine_backend import Chunk, EngineCounters, GenerateRequest, ReplicaLoad

logger = logging.getLogger(__name__)

CACHE_BLOCK_TOKENS = 64
MIN_SLEEP_S = 0.001
"""Passes are slept in real time once they add up to this (below it, timers are not precise anyway)."""
MAX_BUSY_S = 0.002
"""With near-zero pass costs, the loop still yields this often."""
ABORTED = -1
"""Stream sentinel: the request was aborted from outside its stream."""
SYNTHETIC_WORDS = [
    "the",
    "quick",
    "answer",
    "is",
    "that",
    "shorter",
    "passes",
    "keep",
    "chats",
    "responsive",
    "while",
    "long",
    "documents",
    "still",
    "prefill",
    "at",
    "nearly",
    "full",
    "speed",
    "because",
    "every",
    "request",
    "gets",
    "a",
    "fair",
    "share",
    "of",
    "each",
    "forward",
    "pass",
]


class SessionPrefixCache:
    """Per-session cached context as chained block hashes; LRU in sessions, bounded in tokens."""

    def __init__(self, chars_per_token: float, max_sessions: int, max_tokens: int) -> None:
        self.block_chars = max(1, round(CACHE_BLOCK_TOKENS * chars_per_token))
        self.chars_per_token = chars_per_token
        self.max_sessions = max_sessions
        self.max_tokens = max_tokens
        self._blocks: OrderedDict[str, list[bytes]] = OrderedDict()
        self._tokens: dict[str, int] = {}
        self.total_tokens = 0

    def _hashes(self, text: str, limit: int | None = None) -> list[bytes]:
        out: list[bytes] = []
        h = b""
        n = len(text) // self.block_chars
        for i in range(n if limit is None else min(n, limit)):
            h = hashlib.blake2b(
                h + text[i * self.block_chars : (i + 1) * self.block_chars].encode(), digest_size=16
            ).digest()
            out.append(h)
        return out

    def match(self, session: str | None, text: str) -> int:
        """Tokens of `text`'s prefix that the session's cached context covers."""
        if not session or session not in self._blocks:
            return 0
        cached = self._blocks[session]
        self._blocks.move_to_end(session)
        num = 0
        for a, b in zip(self._hashes(text, len(cached)), cached, strict=False):
            if a != b:
                break
            num += 1
        return min(self._tokens[session], int(num * self.block_chars / self.chars_per_token))

    def store(self, session: str | None, text: str, num_tokens: int) -> None:
        if not session or self.max_sessions == 0:
            return
        self.drop(session)
        num_tokens = min(num_tokens, self.max_tokens)
        self._blocks[session] = self._hashes(text)
        self._tokens[session] = num_tokens
        self.total_tokens += num_tokens
        while self._blocks and (len(self._blocks) > self.max_sessions or self.total_tokens > self.max_tokens):
            self.drop(next(iter(self._blocks)))

    def drop(self, session: str) -> None:
        if self._blocks.pop(session, None) is not None:
            self.total_tokens -= self._tokens.pop(session)

    def tokens(self, session: str) -> int:
        return self._tokens.get(session, 0)

    def recent(self, limit: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in reversed(self._blocks):
            if len(out) >= limit:
                break
            out[s] = self._tokens[s]
        return out

    def resize(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        while len(self._blocks) > max_sessions:
            self.drop(next(iter(self._blocks)))


def synthetic_text(start: int, end: int) -> str:
    """Output tokens [start, end) as words; deterministic, so tests can aim `stop` at it."""
    return "".join(SYNTHETIC_WORDS[i % len(SYNTHETIC_WORDS)] + " " for i in range(start, end))


class _Stream:
    __slots__ = ("queue",)

    def __init__(self) -> None:
        self.queue: asyncio.Queue[int | None] = asyncio.Queue()


class SimBackend:
    def __init__(self, cfg: AppConfig, knobs: EngineKnobs) -> None:
        self.cfg = cfg
        self.model_id = cfg.served_model_id
        self.preset = PRESETS[cfg.sim.preset]
        self._base_policy, max_cut = sim_base_policy(cfg.sim)
        self._counters = EngineCounters()
        self.scheduler = PolicyScheduler(policy_config(self._base_policy, knobs.policy), max_cut_requests=max_cut)
        self.engine = SimEngine(self.preset.cost, self.scheduler)
        self.time_scale = knobs.time_scale
        self.cache = SessionPrefixCache(
            cfg.sim.chars_per_token, knobs.session_cache_sessions, self.preset.cost.kv_pool_tokens
        )
        self._streams: dict[str, _Stream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.num_passes_by_kind: dict[str, int] = {}

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine-loop")

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def reconfigure(self, knobs: EngineKnobs) -> None:
        cfg = policy_config(self._base_policy, knobs.policy)  # raises ConfigError; nothing changed yet
        self.scheduler.reconfigure(cfg)
        self.time_scale = knobs.time_scale
        self.cache.resize(knobs.session_cache_sessions)
        logger.info("sim engine reconfigured: time_scale=%s %s", self.time_scale, cfg.describe_cap())

    # -- engine loop -----------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        debt_s = 0.0  # pass time not slept yet: passes shorter than the loop's timer resolution add up
        last_yield_s = loop.time()
        while True:
            if self.engine.idle:
                await self._wait_for_work()
                debt_s, last_yield_s = 0.0, loop.time()
                continue
            res = self.engine.step(loop.time())
            if res.kind is PassKind.IDLE:
                # Requests wait but none can be admitted now (KV or slots): an arrival or abort changes that.
                await self._wait_for_work()
                debt_s, last_yield_s = 0.0, loop.time()
                continue
            self.num_passes_by_kind[res.kind.value] = self.num_passes_by_kind.get(res.kind.value, 0) + 1
            # The pass is in flight: arrivals in the meantime are scheduled in the next pass.
            debt_s += res.duration_s * self.time_scale
            if debt_s >= MIN_SLEEP_S:
                await asyncio.sleep(debt_s)
                debt_s, last_yield_s = 0.0, loop.time()
            elif loop.time() - last_yield_s >= MAX_BUSY_S:
                await asyncio.sleep(0)  # near-zero-cost passes: still let arrivals and streams run
                last_yield_s = loop.time()
            self._deliver(res)

    async def _wait_for_work(self) -> None:
        self._wake.clear()
        await self._wake.wait()

    def _deliver(self, res: StepResult) -> None:
        for rid, num_generated in res.emitted:
            stream = self._streams.get(rid)
            if stream is not None:
                stream.queue.put_nowait(num_generated)
        for rid in res.finished:
            stream = self._streams.get(rid)
            if stream is not None:
                stream.queue.put_nowait(None)

    # -- requests --------------------------------------------------------------------------
    def output_plan(self, max_tokens: int) -> tuple[int, str]:
        natural = self.cfg.sim.natural_output_tokens
        return (max_tokens, "length") if max_tokens < natural else (natural, "stop")

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Chunk]:
        if request.rid in self._streams:
            raise ValueError(f"request id {request.rid!r} is already running")
        cached = min(self.cache.match(request.session_id, request.prompt_text), request.prompt_tokens - 1)
        num_output, natural_reason = self.output_plan(request.max_tokens)
        sim_req = SimRequest(
            rid=request.rid,
            prompt_tokens=request.prompt_tokens,
            output_tokens=num_output,
            arrival_s=asyncio.get_running_loop().time(),
            traffic_class=TrafficClass(request.traffic_class),
            cached_tokens=max(0, cached),
            session=request.session_id,
        )
        self.engine.add(sim_req)  # ValueError when it can never fit in KV
        stream = _Stream()
        self._streams[request.rid] = stream
        self._wake.set()
        completed = False
        produced = 0
        output: list[str] = []
        cached_first: int | None = sim_req.cached_tokens  # reported with the first chunk
        try:
            while True:
                batch = [await stream.queue.get()]
                while not stream.queue.empty():
                    batch.append(stream.queue.get_nowait())
                if ABORTED in batch:
                    return
                counts = [n for n in batch if n is not None]
                upto = max(counts) if counts else produced
                text = synthetic_text(produced, upto)
                finish: str | None = natural_reason if None in batch else None
                stop_at = _find_stop(output, text, request.stop)
                if stop_at is not None:
                    text, finish = text[:stop_at], "stop"
                    self.engine.abort(request.rid)  # the answer is complete: free its slot and KV now
                num_new, produced = upto - produced, upto
                output.append(text)
                if finish is not None:
                    completed = True
                yield Chunk(text, num_new, cached_first, finish, produced)  # type: ignore[arg-type]
                cached_first = None
                if completed:
                    return
        finally:
            self._streams.pop(request.rid, None)
            if completed:
                self._counters.num_finished += 1
                context = request.prompt_text + "".join(output)
                self.cache.store(request.session_id, context, request.prompt_tokens + produced)
            elif self.engine.abort(request.rid):
                # Client went away (or the replica is stopping): free the queue slot and the KV now.
                self._counters.num_aborted += 1
                self._wake.set()

    def abort(self, rid: str) -> bool:
        stream = self._streams.pop(rid, None)
        aborted = self.engine.abort(rid)
        if stream is not None:
            stream.queue.put_nowait(ABORTED)
        if aborted:
            self._counters.num_aborted += 1
            self._wake.set()
        return aborted

    # -- views -----------------------------------------------------------------------------
    def load(self) -> ReplicaLoad:
        e = self.engine
        prefilling = [r for r in e.running if r.phase is Phase.PREFILLING]
        return ReplicaLoad(
            num_waiting=len(e.waiting),
            num_prefilling=len(prefilling),
            num_decoding=len(e.running) - len(prefilling),
            prefill_tokens=sum(r.extend_tokens for r in e.waiting) + sum(r.extend_tokens for r in prefilling),
            max_running_requests=self.scheduler.max_running_requests,
            kv_used_tokens=e.kv_used_tokens,
            kv_total_tokens=self.preset.cost.kv_pool_tokens,
        )

    def cached_tokens(self, session_id: str) -> int:
        return self.cache.tokens(session_id)

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
            "num_passes_by_kind": dict(self.num_passes_by_kind),
            "num_cached_sessions": len(self.cache.recent(self.cache.max_sessions)),
            "cached_tokens_total": self.cache.total_tokens,
            "counters": {
                "finished": self._counters.num_finished,
                "aborted": self._counters.num_aborted,
                "skip_ahead": self.scheduler.planner.num_skip_ahead,
            },
        }


def _find_stop(previous: list[str], new_text: str, stops: tuple[str, ...]) -> int | None:
    """Index in `new_text` where the first stop string begins (a stop may straddle the previous text)."""
    if not stops or not new_text:
        return None
    tail = "".join(previous)[-max(len(s) for s in stops) :]
    window = tail + new_text
    best: int | None = None
    for s in stops:
        i = window.find(s)
        if i >= 0:
            cut = max(0, i - len(tail))
            best = cut if best is None else min(best, cut)
    return best
