"""The `sglang` backend: `sglang.Engine` (0.5.23) in the replica's process, one GPU per replica.

`Engine.__init__` calls `load_plugins()`, and so does its scheduler child process: our plugin
(entry point `sglang.srt.plugins: fairshare`) runs the policy core inside sglang's scheduler. The
policy is read there from `FAIRSHARE_*` environment variables (`scheduler.config`), which this
backend sets from `Engine.user_config.policy` before the engine starts; the child inherits them.

Not testable without a GPU and weights; kept to the calls checked against sglang 0.5.23's source:
`Engine.async_generate(input_ids=..., sampling_params=..., stream=True, rid=...)` returns an async
iterator of dicts with cumulative `text` and `meta_info` (`prompt_tokens`, `completion_tokens`,
`cached_tokens`, `finish_reason`); `tokenizer_manager.abort_request(rid=...)` aborts one request;
`tokenizer_manager.get_loads()` returns per-scheduler `LoadSnapshot`s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from scheduler.config import env_var_name
from serve_app.config import AppConfig, ConfigError, EngineKnobs
from serve_app.engine_backend import Chunk, EngineCounters, GenerateRequest, ReplicaLoad

logger = logging.getLogger(__name__)

LOAD_REFRESH_S = 0.25
MAX_TRACKED_SESSIONS = 4096


class SglangBackend:
    def __init__(self, cfg: AppConfig, knobs: EngineKnobs) -> None:
        self.cfg = cfg
        self.model_id = cfg.served_model_id
        self._policy = dict(knobs.policy)
        self._engine: Any = None
        self._load = ReplicaLoad()
        self._load_task: asyncio.Task | None = None
        self._active: set[str] = set()
        self._sessions: OrderedDict[str, int] = OrderedDict()
        self._counters = EngineCounters()

    async def start(self) -> None:
        if self._engine is not None:
            return
        for field, value in self._policy.items():
            os.environ[env_var_name(field)] = "none" if value is None else str(value)
        import sglang  # here, not at module level: only GPU machines have it

        s = self.cfg.sglang
        kwargs: dict[str, Any] = {
            "model_path": s.model_path,
            "tp_size": s.tp_size,
            "enable_mixed_chunk": s.enable_mixed_chunk,
            "log_level": "warning",
        }
        for name in ("mem_fraction_static", "context_length", "chunked_prefill_size", "max_running_requests"):
            if getattr(s, name) is not None:
                kwargs[name] = getattr(s, name)
        kwargs.update(s.engine_args)
        # The constructor blocks while weights load; keep the replica's event loop answering health checks.
        self._engine = await asyncio.to_thread(lambda: sglang.Engine(**kwargs))
        self._load_task = asyncio.get_running_loop().create_task(self._poll_load())

    async def shutdown(self) -> None:
        if self._load_task is not None:
            self._load_task.cancel()
        if self._engine is not None:
            await asyncio.to_thread(self._engine.shutdown)
            self._engine = None

    def reconfigure(self, knobs: EngineKnobs) -> None:
        if self._engine is not None and dict(knobs.policy) != self._policy:
            raise ConfigError(
                "Engine.user_config.policy: the sglang backend reads the policy when its engine starts; "
                "changing it needs a replica restart (redeploy with a changed `args` or restart the app)"
            )
        self._policy = dict(knobs.policy)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Chunk]:
        sampling = {"max_new_tokens": request.max_tokens, "temperature": request.temperature}
        if request.stop:
            sampling["stop"] = list(request.stop)
        source = (
            {"input_ids": request.prompt_token_ids}
            if request.prompt_token_ids is not None
            else {"prompt": request.prompt_text}
        )
        stream = await self._engine.async_generate(sampling_params=sampling, stream=True, rid=request.rid, **source)
        self._active.add(request.rid)
        done = False
        sent_chars = 0
        completion_tokens = 0
        first = True
        try:
            async for out in stream:
                meta = out.get("meta_info", {})
                text = out.get("text") or ""  # cumulative (sglang's default, non-incremental streaming)
                num_new = int(meta.get("completion_tokens", completion_tokens)) - completion_tokens
                completion_tokens += num_new
                delta, sent_chars = text[sent_chars:], len(text)
                finish = meta.get("finish_reason")
                reason = None
                if finish:
                    done = True
                    reason = "length" if isinstance(finish, dict) and finish.get("type") == "length" else "stop"
                if delta or num_new or reason:
                    cached = int(meta.get("cached_tokens", 0)) if first else None
                    yield Chunk(delta, num_new, cached, reason, completion_tokens)  # type: ignore[arg-type]
                    first = False
                if done:
                    return
        finally:
            self._active.discard(request.rid)
            if done:
                self._counters.num_finished += 1
                self._remember(request.session_id, request.prompt_tokens + completion_tokens)
            else:
                self.abort(request.rid)

    def abort(self, rid: str) -> bool:
        if self._engine is None:
            return False
        self._engine.tokenizer_manager.abort_request(rid=rid)
        self._counters.num_aborted += 1
        return True

    async def _poll_load(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                snaps = await self._engine.tokenizer_manager.get_loads()
                self._load = ReplicaLoad(
                    num_waiting=sum(s.num_waiting_reqs for s in snaps),
                    num_decoding=sum(s.num_running_reqs for s in snaps),
                    prefill_tokens=sum(s.num_waiting_uncached_tokens for s in snaps),
                    max_running_requests=sum(s.max_running_requests for s in snaps),
                    kv_used_tokens=sum(s.num_used_tokens for s in snaps),
                    kv_total_tokens=sum(s.max_total_num_tokens for s in snaps),
                )
            await asyncio.sleep(LOAD_REFRESH_S)

    def _remember(self, session: str | None, tokens: int) -> None:
        # sglang's radix cache is keyed by prefix, not session; this is the estimate routers need.
        if not session:
            return
        self._sessions[session] = tokens
        self._sessions.move_to_end(session)
        while len(self._sessions) > MAX_TRACKED_SESSIONS:
            self._sessions.popitem(last=False)

    def load(self) -> ReplicaLoad:
        return self._load

    def cached_tokens(self, session_id: str) -> int:
        return self._sessions.get(session_id, 0)

    def recent_sessions(self, limit: int) -> dict[str, int]:
        return dict(list(self._sessions.items())[-limit:]) if limit else {}

    def pending_requests(self, limit: int) -> dict[str, int]:
        # sglang's load snapshot has counts, not ids: routers then rely on counts and their own sends.
        return {}

    def counters(self) -> EngineCounters:
        return self._counters

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "sglang",
            "pid": os.getpid(),
            "model_path": self.cfg.sglang.model_path,
            "policy": self._policy,
            "active_request_ids": sorted(self._active),
            "kv_used_tokens": self._load.kv_used_tokens,
            "counters": {"finished": self._counters.num_finished, "aborted": self._counters.num_aborted},
        }
