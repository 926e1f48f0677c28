"""A stand-in for `sglang.Engine` with the calls the sglang backend makes outside sglang's serving classes.

It records the constructor's arguments and the `FAIRSHARE_*` environment the scheduler process would
inherit at that moment, so tests see exactly what a real engine would have started with. With `kv_events` set it
also publishes KV events as sglang's scheduler does: sglang's own publisher, built from the `kv_events_config` it
was given (sglang is imported only then: the import takes seconds).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

SGLANG_ARGS = {"backend": "sglang", "sglang": {"model_path": "/models/tiny-llama", "context_length": 4096}}
DEADLINE_S = 30
"""Generous: the engine's threads share 2 loaded cores with everything else."""


class FakeTokenizerManager:
    def __init__(self) -> None:
        self.aborted: list[str] = []
        self.load_reads = 0

    def abort_request(self, rid: str) -> None:
        self.aborted.append(rid)

    async def get_loads(self) -> list[Any]:
        self.load_reads += 1
        return []

    async def get_internal_state(self) -> list[dict[str, Any]]:
        """One scheduler's internal state, with the plugin's live state as it reports it."""
        return [{"max_total_num_tokens": 4096, "fairshare": dict(FakeSglangEngine.policy_state)}]


class FakeSglangEngine:
    started: ClassVar[list[FakeSglangEngine]] = []
    policy_state: ClassVar[dict[str, Any]] = {}
    """What the plugin reports in the scheduler's internal state (`SchedulerPolicy.describe`)."""
    kv_events: ClassVar[bool] = False
    """Publish KV events (`publish_kv_events`) on the `kv_events_config` endpoint, with sglang's publisher."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.env = {k: v for k, v in os.environ.items() if k.startswith("FAIRSHARE_")}
        self.tokenizer_manager = FakeTokenizerManager()
        self.publisher: Any = None
        if FakeSglangEngine.kv_events and kwargs.get("kv_events_config"):
            from sglang.srt.disaggregation.kv_events import EventPublisherFactory

            self.publisher = EventPublisherFactory.create(kwargs["kv_events_config"])  # as sglang's scheduler
        FakeSglangEngine.started.append(self)

    def publish_kv_events(self, events: Sequence[Any]) -> None:
        """One scheduler pass's events (sglang's `BlockStored`, `BlockRemoved`, `AllBlocksCleared`), as one batch."""
        from sglang.srt.disaggregation.kv_events import KVEventBatch

        assert self.publisher is not None, "set FakeSglangEngine.kv_events before the engine starts"
        self.publisher.publish(KVEventBatch(ts=time.time(), events=list(events)))

    def shutdown(self) -> None:
        if self.publisher is not None:
            self.publisher.shutdown()


def isolate_replica(monkeypatch: Any) -> list[Any]:
    """Outside Serve: an `Engine` replica whose sglang is `FakeSglangEngine`; the `FAIRSHARE_*` variables the backend
    exports for the policy stay inside the test. Returns the backends the replicas make, for `release_backends`."""
    from types import SimpleNamespace

    from serve_app.engines.sglang.sglang_backend import SglangBackend
    from serve_app.replica import engine_replica

    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if not k.startswith("FAIRSHARE_")})
    FakeSglangEngine.started = []
    FakeSglangEngine.policy_state = {}
    ctx = SimpleNamespace(replica_tag="Engine#r0", rank=SimpleNamespace(rank=0), world_size=1)
    monkeypatch.setattr(engine_replica.serve, "get_replica_context", lambda: ctx)
    made: list[SglangBackend] = []

    def make_backend(cfg: Any, knobs: Any) -> SglangBackend:
        made.append(SglangBackend(cfg, knobs, engine_factory=FakeSglangEngine))
        return made[-1]

    monkeypatch.setattr(engine_replica, "make_backend", make_backend)
    return made


def fake_backend(**engine_args: Any) -> Any:
    """An `SglangBackend` on `SGLANG_ARGS` (with `engine_args`) whose sglang is `FakeSglangEngine`."""
    from serve_app.config import AppConfig, EngineKnobs, validate
    from serve_app.engines.sglang.sglang_backend import SglangBackend

    args = {**SGLANG_ARGS, "sglang": {**SGLANG_ARGS["sglang"], "engine_args": engine_args}}
    return SglangBackend(validate(AppConfig, args, "args"), EngineKnobs(), engine_factory=FakeSglangEngine)


async def until_async(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S} s: {what}"
        await asyncio.sleep(0.01)


def release_backends(backends: Sequence[Any]) -> None:
    """Stop what a test's backends left running (a replica outside Serve is never shut down): each engine start's
    KV-event subscriber (a thread, a socket, the process's endpoint folder) and its engine loop thread."""
    for backend in backends:
        asyncio.run(backend.shutdown())
