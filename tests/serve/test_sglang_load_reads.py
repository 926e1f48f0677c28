"""When the sglang backend reads its engine's load: every `LOAD_REFRESH_S` while the engine has work, only when a
request comes while it has none (each read wakes sglang's scheduler). A stand-in engine counts the reads; the idle
interval is made an hour, so a read while idle is a wrong decision, never a slow machine."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable

import pytest

from serve_app.engines.sglang import sglang_backend
from serve_app.replica.backend import SSE, OpenAIRequest, ResponseBody, ResponsePart, ResponseStart
from tests.serve.fake_sglang import DEADLINE_S, FakeSglangEngine, fake_backend, isolate_replica, until_async

IDLE_LOOK_S = 0.3
"""How long a test watches an idle engine for a read it must not make (30 reads at the busy interval)."""


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    isolate_replica(monkeypatch)
    monkeypatch.setattr(sglang_backend, "LOAD_REFRESH_S", 0.01)
    monkeypatch.setattr(sglang_backend, "IDLE_LOAD_REFRESH_S", 3600.0)


class HeldAnswer:
    """sglang's serving classes, stood in: a stream that starts, then waits for `release` before it ends."""

    def __init__(self) -> None:
        self.release = threading.Event()

    async def respond(self, kind: str, body: dict, rid: str, **_: object) -> AsyncIterator[ResponsePart]:
        yield ResponseStart(200, SSE)
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        yield ResponseBody(b"data: [DONE]\n\n")


async def until_quiet(reads: Callable[[], int]) -> None:
    """Until no read comes for `IDLE_LOOK_S`."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        before = reads()
        await asyncio.sleep(IDLE_LOOK_S)
        if reads() == before:
            return
        assert time.monotonic() < deadline, f"still read every {sglang_backend.LOAD_REFRESH_S} s after {DEADLINE_S} s"


def test_an_idle_engine_is_read_when_a_request_comes_often_while_it_works_and_not_after() -> None:
    async def go() -> None:
        b = fake_backend()
        await b.start()
        try:
            tm = FakeSglangEngine.started[0].tokenizer_manager
            reads = lambda: tm.load_reads  # noqa: E731
            await until_async(lambda: b.load().ready, "the first read")
            await asyncio.sleep(IDLE_LOOK_S)
            idle = reads()
            assert idle == 1, "an idle engine read again before any request came"

            answer = HeldAnswer()
            b._openai = answer  # type: ignore[assignment]
            parts = b.respond(OpenAIRequest("chat", {"messages": []}, "r1", prompt_tokens=40))
            assert isinstance((await anext(parts))[0], ResponseStart)
            await until_async(lambda: reads() >= idle + 3, "reads while the request is in flight")

            answer.release.set()
            assert [p async for batch in parts for p in batch] == [ResponseBody(b"data: [DONE]\n\n")]
            await until_quiet(reads)  # the engine, idle again, is read only when a request comes
        finally:
            await b.shutdown()

    asyncio.run(go())


def test_a_request_counts_in_the_load_at_once_and_the_engine_is_read_after_its_first_pass(monkeypatch) -> None:
    """A read is a round trip through sglang's scheduler: at a request's arrival it would run beside the request's
    own first pass. The replica counts the request itself, at once, and reads the engine `LOAD_REFRESH_S` later
    (made an hour here, so a read before it is a wrong decision)."""

    async def go() -> None:
        b = fake_backend()
        await b.start()
        try:
            tm = FakeSglangEngine.started[0].tokenizer_manager
            await until_async(lambda: b.load().ready, "the first read")
            monkeypatch.setattr(sglang_backend, "LOAD_REFRESH_S", 3600.0)
            read = tm.load_reads
            assert b.load().num_pending == 0

            answer = HeldAnswer()
            b._openai = answer  # type: ignore[assignment]
            parts = b.respond(OpenAIRequest("chat", {"messages": []}, "r1", prompt_tokens=40))
            assert isinstance((await anext(parts))[0], ResponseStart)
            load = b.load()
            assert (load.num_pending, load.prefill_tokens) == (1, 40), "the request is in the load before any read"
            await asyncio.sleep(IDLE_LOOK_S)
            assert tm.load_reads == read, "the engine was read beside the request's first pass"

            answer.release.set()
            assert [p async for batch in parts for p in batch] == [ResponseBody(b"data: [DONE]\n\n")]
            assert b.load().num_pending == 0, "its first output takes it out of the load, before any read"
            assert tm.load_reads == read
        finally:
            await b.shutdown()

    asyncio.run(go())
