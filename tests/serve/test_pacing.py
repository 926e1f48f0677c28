"""A stream's items after its first output go on spaced, each holding what came since; nothing is lost or held
past the stream's end. The spacing here is minutes, so no assertion depends on how fast this machine runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serve_app.replica.backend import ResponseBody, ResponseStart, carries_output
from serve_app.replica.pacing import paced

LONG_S = 600.0
"""A spacing no test waits out: an item that is held stays held until the stream ends."""
START = ResponseStart(200, "text/event-stream")


OPENING = ResponseBody(b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n')
"""A chat stream's first event, as sglang writes it: its role, no text."""


def body(text: str) -> ResponseBody:
    """A chat chunk carrying `text`."""
    return ResponseBody(f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': text}}]})}\n\n".encode())


def starts(batch: Sequence[object]) -> bool:
    return carries_output(batch, "content")  # type: ignore[arg-type]


class Source:
    """A stream the test writes to: a list on `queue` is a batch, an exception fails it, None ends it. It records
    whether it was closed."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.closed = False

    async def batches(self) -> AsyncGenerator[list[object], None]:
        try:
            while (item := await self.queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item  # type: ignore[misc]
        finally:
            self.closed = True


async def next_within(stream: AsyncGenerator[list[object], None], seconds: float = 30.0) -> list[object]:
    return await asyncio.wait_for(anext(stream), seconds)


def test_first_output_goes_at_once_and_later_ones_are_held_until_the_end() -> None:
    async def go() -> None:
        src = Source()
        out = paced(src.batches(), LONG_S, starts)
        await src.queue.put([START])
        assert await next_within(out) == [START]  # no output yet: not held
        await src.queue.put([body("a")])
        assert await next_within(out) == [body("a")]  # the first token is the TTFT
        for text in "bcd":
            await src.queue.put([body(text)])
        pending = asyncio.ensure_future(anext(out))
        await asyncio.sleep(0.2)
        assert not pending.done()  # held: the spacing has not passed
        await src.queue.put(None)
        assert await asyncio.wait_for(pending, 30) == [body("b"), body("c"), body("d")]  # the end flushes at once
        with pytest.raises(StopAsyncIteration):
            await next_within(out)

    asyncio.run(go())


def test_a_chats_opening_alone_does_not_hold_its_first_token() -> None:
    # sglang writes the opening (role, no text) in its own item when the first token has no text yet; the first text
    # an engine step later is the client's TTFT and goes on at once.
    async def go() -> None:
        src = Source()
        out = paced(src.batches(), LONG_S, starts)
        await src.queue.put([START, OPENING])
        assert await next_within(out) == [START, OPENING]
        await src.queue.put([body("a")])
        assert await next_within(out) == [body("a")]
        await src.queue.put([body("b")])
        pending = asyncio.ensure_future(anext(out))
        await asyncio.sleep(0.2)
        assert not pending.done()  # after the first text: held
        await src.queue.put(None)
        assert await asyncio.wait_for(pending, 30) == [body("b")]

    asyncio.run(go())


def test_a_failure_goes_on_after_what_was_held() -> None:
    async def go() -> None:
        src = Source()
        out = paced(src.batches(), LONG_S, starts)
        await src.queue.put([START, body("a")])
        assert await next_within(out) == [START, body("a")]
        await src.queue.put([body("b")])
        await src.queue.put(RuntimeError("engine died"))
        assert await next_within(out) == [body("b")]
        with pytest.raises(RuntimeError, match="engine died"):
            await next_within(out)

    asyncio.run(go())


def test_closing_the_paced_stream_closes_the_source_held_or_not() -> None:
    async def go(hold: bool) -> None:
        src = Source()
        out = paced(src.batches(), LONG_S, starts)
        await src.queue.put([START, body("a")])
        await next_within(out)
        if hold:
            await src.queue.put([body("b")])
            pending = asyncio.ensure_future(anext(out))
            await asyncio.sleep(0.05)
            pending.cancel()  # the client left while a token was held
            with pytest.raises(asyncio.CancelledError):
                await pending
        await out.aclose()
        assert src.closed  # the engine call is closed (which aborts the request in the engine)

    asyncio.run(go(hold=False))
    asyncio.run(go(hold=True))


@given(
    batches=st.lists(st.lists(st.sampled_from([START, OPENING, body("x"), body("yz")]), max_size=3), max_size=12),
    spacing_s=st.sampled_from([0.0, 1e-4, 1e-3, LONG_S]),
)
def test_every_part_comes_through_once_in_order(batches, spacing_s) -> None:
    async def go() -> list[object]:
        async def source() -> AsyncGenerator[list[object], None]:
            for batch in batches:
                await asyncio.sleep(0)
                yield batch

        return [part async for batch in paced(source(), spacing_s, starts) for part in batch]

    assert asyncio.run(go()) == [part for batch in batches for part in batch]
