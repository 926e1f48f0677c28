"""The `sglang` backend: `sglang.Engine` (0.5.23) in the replica's process, one GPU per replica.

`Engine.__init__` calls `load_plugins()`, and so does its scheduler child process: our plugin
(entry point `sglang.srt.plugins: fairshare`) runs the policy core inside sglang's scheduler. The
policy is read there from `FAIRSHARE_*` environment variables (`scheduler.config`), which this
backend sets from `Engine.user_config.policy` before the engine starts; the child inherits them.
The replica applies its first `user_config` before `start`, so the policy is validated (as a
`PolicyConfig`) and in force from the engine's first pass. sglang reads the policy once, when its
scheduler process starts: a later policy change restarts the replica's engine in place (logged, counted in
the admin view's `engine_starts`); requests in flight then end with an error.
Mixed decode has one switch, the policy's `mixed_decode`, passed as sglang's `enable_mixed_chunk`.

OpenAI requests are answered by sglang's own serving classes (`respond`, `openai_serving`): the engine
writes the response, this backend relays it; a request's tenant and weight go with it as sglang's routing key, which
the plugin reads in the scheduler. Besides them, kept to the calls checked against sglang
0.5.23's source (unit tests drive a stand-in engine): `tokenizer_manager.get_loads()` returns per-scheduler
`LoadSnapshot`s (the published load, `load_snapshot`); `get_internal_state()` each scheduler's state, where the
plugin's live state is ``fairshare`` (the pass-cost fit): the admin view's `scheduler_policy`. The engine is
built and always called on its own loop (`EngineThread`), never on the replica's.

What the engine's radix cache holds reaches the router from sglang's own KV events (`kv_events`): each engine
start gets a fresh subscriber on a private `ipc://` endpoint, passed to sglang as `kv_events_config`; its thread
replays the events into `held` (under a lock: `held_prefixes` reads it from the replica's loop). The replica owns
that setting: one given in `sglang.engine_args` is refused when the config is validated, since sglang has one
publisher per engine and the routing depends on reading it. Stopping the engine (a shutdown, a restart) stops the
subscriber and clears `held`: a new engine starts empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import TYPE_CHECKING, Any

from scheduler.config import PolicyConfig, env_var_name
from scheduler.sglang_plugin.env import policy_env
from serve_app.config import (
    AppConfig,
    EngineKnobs,
    engine_policy,
    environment_policy,
    reported_passes,
    reported_policy,
    sglang_engine_kwargs,
)
from serve_app.engines.sglang.engine_thread import EngineThread
from serve_app.engines.sglang.kv_events import KvEventStream
from serve_app.engines.sglang.load_snapshot import EngineReading
from serve_app.engines.sglang.openai_serving import SglangOpenAI
from serve_app.replica.backend import (
    EngineCapacity,
    EngineCounters,
    OpenAIRequest,
    ReplicaLoad,
    ResponseBody,
    ResponsePart,
)
from serve_app.replica.held_prefixes import AllCleared, HeldPrefixes, KvEvent

if TYPE_CHECKING:
    from sglang.srt.entrypoints.engine import Engine as SglangEngine

logger = logging.getLogger(__name__)

LOAD_REFRESH_S = 0.25
"""How often the engine's load is read while it has work: a request in flight here or in its snapshot. An idle
engine is read this long after a request comes: the replica counts the request itself at once (`EngineReading`), so a
read beside its first pass tells nothing new (measured, it moved no first token: `benchmarks.chat_path --gap-s`)."""
IDLE_LOAD_REFRESH_S = 5.0
"""While it has none: its load changes only when a request comes (`_work`). A read wakes sglang's scheduler and the
engine's loop: 4 a second took ~1% of a core per idle engine (/proc schedstat of the idle app's threads)."""
POLICY_STATE_POLLS = 8  # the plugin's state every 8th load read: sglang assembles its whole internal state


EngineFactory = Callable[..., "SglangEngine"]
"""`sglang.Engine`, or a stand-in with the same calls (tests)."""


def _sglang_engine(**kwargs: Any) -> SglangEngine:
    # Imported here, not at module level: importing sglang takes seconds and only this backend needs it.
    from sglang.srt.entrypoints.engine import Engine

    return Engine(**kwargs)


class SglangBackend:
    def __init__(self, cfg: AppConfig, knobs: EngineKnobs, engine_factory: EngineFactory = _sglang_engine) -> None:
        self.cfg = cfg
        self.model_id = cfg.served_model_id
        self._engine_factory = engine_factory
        self._env_policy = environment_policy()
        """The policy knobs the replica's environment sets, read before the backend exports its own: they apply below
        `Engine.user_config.policy` (which the backend then exports) at every engine start."""
        self._policy_overrides = dict(knobs.policy)
        self._policy = engine_policy(cfg, self._engine_overrides())
        self._engine: SglangEngine | None = None
        self._loop: EngineThread | None = None
        self._openai: SglangOpenAI | None = None
        self._load = ReplicaLoad(ready=False)
        """Not ready until the first snapshot of a started engine: routers send a loading replica nothing."""
        self._reading = EngineReading()
        self._policy_state: list[Any] = []
        self._load_task: asyncio.Task[None] | None = None
        self._active: set[str] = set()
        self._work = asyncio.Event()  # set when a request comes: an idle engine's load is read again soon
        self.held = HeldPrefixes()
        """What the engine's radix cache holds, from its KV events (applied on the subscriber's thread)."""
        self._held_lock = threading.Lock()
        self._kv_events: KvEventStream | None = None
        self._counters = EngineCounters()
        self._restart_pending = False
        self.engine_starts = 0

    def engine_kwargs(self) -> dict[str, Any]:
        return sglang_engine_kwargs(self.cfg.sglang, self._policy.mixed_decode)

    async def start(self) -> None:
        if self._engine is not None:
            return
        for field in PolicyConfig.model_fields:  # a field dropped from the overrides since the last start too
            os.environ.pop(env_var_name(field), None)
        os.environ.update(policy_env(self._engine_overrides()))
        # Subscribed before the engine binds its publisher: the engine's first events are not missed.
        self._kv_events = KvEventStream(self._apply_kv_events)
        kwargs = {**self.engine_kwargs(), "kv_events_config": self._kv_events.engine_config()}
        # Built on its own loop's thread: the constructor blocks while weights load (the replica's loop keeps
        # answering health checks), and sglang must later be called on the loop it was built with.
        self._loop = EngineThread()
        try:
            engine = await self._loop.build(lambda: self._engine_factory(**kwargs))
        except BaseException:
            await self._stop_kv_events()
            raise
        self._engine = engine
        self._openai = await self._loop.build(lambda: SglangOpenAI(engine))
        self._load_task = asyncio.get_running_loop().create_task(self._poll_load())
        self.engine_starts += 1

    async def shutdown(self) -> None:
        self._load = ReplicaLoad(ready=False)
        self._reading.forget()
        if self._load_task is not None:
            self._load_task.cancel()
            self._load_task = None
        if self._engine is not None:
            await asyncio.to_thread(self._engine.shutdown)
            self._engine = None
        if self._loop is not None:
            self._loop.stop()
            self._loop = None
        await self._stop_kv_events()

    def _apply_kv_events(self, events: list[KvEvent]) -> None:
        """The subscriber's sink (its thread)."""
        with self._held_lock:
            self.held.apply(events)

    async def _stop_kv_events(self) -> None:
        if self._kv_events is not None:
            await asyncio.to_thread(self._kv_events.stop)
            self._kv_events = None
        with self._held_lock:
            self.held.apply([AllCleared()])

    def reconfigure(self, knobs: EngineKnobs) -> None:
        if dict(knobs.policy) == self._policy_overrides:
            return
        # Validated as the plugin will build it, before anything (re)starts: a bad value is a ConfigError naming
        # the field, the old policy stays in force, no scheduler process dies at start.
        self._policy = engine_policy(self.cfg, self._engine_overrides(knobs.policy))
        self._policy_overrides = dict(knobs.policy)
        self._restart_pending = self._engine is not None

    def _engine_overrides(self, policy: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """What the engine's plugin is told: the environment's knobs, then `Engine.user_config.policy` (`policy`,
        default the one in force) over them."""
        return {**self._env_policy, **(self._policy_overrides if policy is None else policy)}

    async def restart_if_needed(self) -> bool:
        """Restart the engine when its policy changed since it started (sglang cannot take a policy live)."""
        if not self._restart_pending:
            return False
        self._restart_pending = False
        logger.warning(
            "policy changed: restarting the sglang engine to apply it (requests in flight end with an error): %s",
            self._policy_overrides,
        )
        await self.shutdown()
        await self.start()
        return True

    @property
    def policy(self) -> PolicyConfig:
        return self._policy

    def capacity(self) -> EngineCapacity:
        context = self.cfg.context_limit_tokens
        assert context is not None, "AppConfig requires a context window for the sglang backend"
        # No prefill rate before the engine has run: the queued-token limit is two windows, Retry-After fixed.
        return EngineCapacity(context)

    async def respond(self, request: OpenAIRequest) -> AsyncGenerator[list[ResponsePart], None]:
        """sglang's own answer: `ResponseStart`, then `ResponseBody` items, in lists of what is ready together.
        Closing the iteration early (client gone) aborts the request in the engine."""
        assert self._loop is not None and self._openai is not None, "respond before start"
        openai, rid = self._openai, request.rid
        self._active.add(rid)
        self._work.set()
        self._load = self._reading.sent(rid, request.uncached_tokens) or self._load
        finished = False
        try:
            # sglang writes one SSE event per output; what is ready together goes to the ingress as one stream item.
            batches = self._loop.batches(
                lambda: openai.respond(
                    request.kind,
                    request.body,
                    rid,
                    prompt_ids=request.prompt_ids,
                    tenant=request.tenant,
                    tenant_weight=request.tenant_weight,
                )
            )
            async with contextlib.aclosing(batches):
                async for batch in batches:
                    if any(isinstance(part, ResponseBody) for part in batch):
                        self._load = self._reading.answered(rid) or self._load  # its first output: prefilled
                    yield batch
            finished = True
        finally:
            self._active.discard(rid)
            self._load = self._reading.answered(rid) or self._load
            if finished:
                self._counters.num_finished += 1
            else:  # the client left: `SglangOpenAI.respond` aborted it in sglang
                self._counters.num_aborted += 1

    async def _poll_load(self) -> None:
        assert self._engine is not None and self._loop is not None, "polled before start"
        loop, tm = self._loop, self._engine.tokenizer_manager
        assert tm is not None, "sglang's engine starts with its tokenizer manager"
        for poll in itertools.count():
            self._work.clear()  # a request from here on is seen by the next read
            with contextlib.suppress(Exception):
                if poll % POLICY_STATE_POLLS == 0:
                    self._policy_state = [s.get("fairshare") for s in await loop.call(tm.get_internal_state)]
                    # What the plugin filled from sglang's own values (e.g. `max_running_requests` sized from memory).
                    self._policy = reported_policy(self._policy_state, self._policy)
            with contextlib.suppress(Exception):
                snaps = await loop.call(tm.get_loads)
                chunk = self.cfg.sglang.chunked_prefill_size or self._policy.chunk_budget_tokens
                self._load = self._reading.read(snaps, time.monotonic(), self._policy, chunk, self._policy_state)
            await self._until_next_read()

    async def _until_next_read(self) -> None:
        if self._active or self._load.num_pending or self._load.num_decoding or not self._load.ready:
            await asyncio.sleep(LOAD_REFRESH_S)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._work.wait(), IDLE_LOAD_REFRESH_S)
            await asyncio.sleep(LOAD_REFRESH_S)  # after the request's own first pass, not beside it

    def load(self) -> ReplicaLoad:
        return self._load

    def held_prefixes(self, limit: int) -> list[int]:
        with self._held_lock:
            return self.held.published(limit)

    def pending_requests(self, limit: int) -> dict[str, int]:
        return self._reading.pending.ids(limit)

    def counters(self) -> EngineCounters:
        self._counters.sized_passes, self._counters.passes_over_target = reported_passes(self._policy_state)
        return self._counters

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "sglang",
            "pid": os.getpid(),
            "model_path": self.cfg.sglang.model_path,
            "policy": self._policy.model_dump(),
            "engine_starts": self.engine_starts,
            "active_request_ids": sorted(self._active),
            "kv_used_tokens": self._load.kv_used_tokens,
            "counters": {"finished": self._counters.num_finished, "aborted": self._counters.num_aborted},
            "scheduler_policy": self._policy_state,
            "held_prefixes": {
                "pages": self.held.num_pages,
                "engine_blocks": self.held.num_blocks,
                "skipped_blocks": self.held.num_skipped,
                "event_batches": 0 if self._kv_events is None else self._kv_events.num_batches,
                "lost_event_batches": 0 if self._kv_events is None else self._kv_events.num_lost,
            },
        }
