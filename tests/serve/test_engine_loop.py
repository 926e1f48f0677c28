"""Engine-loop streams hand over what is ready in batches; the engine replica relays a batch's bytes as one item."""

from __future__ import annotations

import asyncio
import itertools
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serve_app.engine_backend import EngineError, ResponseBody, ResponseStart, joined_bodies
from serve_app.engine_loop import EngineLoop

ITEMS = st.lists(
    st.one_of(
        st.binary(max_size=8).map(ResponseBody),
        st.just(ResponseStart(200, "text/event-stream")),
        st.just(EngineError(503, "gone")),
    ),
    max_size=12,
)


@given(items=ITEMS)
def test_joined_bodies_keep_every_byte_and_every_other_item_in_order(items) -> None:
    joined = joined_bodies(items)

    def others(xs):
        return [i for i in xs if not isinstance(i, ResponseBody)]

    def data(xs):
        return b"".join(i.data for i in xs if isinstance(i, ResponseBody))

    assert others(joined) == others(items) and data(joined) == data(items)
    assert not any(isinstance(a, ResponseBody) and isinstance(b, ResponseBody) for a, b in itertools.pairwise(joined))


def run_with_loop(consume):
    loop = EngineLoop()
    try:
        return asyncio.run(consume(loop))
    finally:
        loop.stop()


def test_items_ready_together_come_in_one_batch_in_order() -> None:
    gate = threading.Event()

    async def produce():
        for i in range(50):
            yield i
        gate.set()

    async def consume(loop: EngineLoop):
        batches = loop.batches(produce)
        first = await batches.__anext__()  # the producer starts with the first look
        await asyncio.get_running_loop().run_in_executor(None, gate.wait, 10)  # then runs to its end
        await asyncio.sleep(0.05)  # and its items' hand-over callbacks run on this loop
        return [first, *[b async for b in batches]]

    batches = run_with_loop(consume)
    assert [i for b in batches for i in b] == list(range(50))
    assert len(batches) <= 2  # what was ready when the consumer looked again came as one batch


def test_a_failure_comes_after_the_items_before_it() -> None:
    async def produce():
        yield "a"
        yield "b"
        raise RuntimeError("engine bug")

    async def consume(loop: EngineLoop):
        seen = []
        with pytest.raises(RuntimeError, match="engine bug"):
            async for batch in loop.batches(produce):
                seen += batch
        return seen

    assert run_with_loop(consume) == ["a", "b"]


def test_stream_is_the_batches_flattened() -> None:
    async def produce():
        for i in range(20):
            yield i
            if i % 7 == 0:
                await asyncio.sleep(0.001)

    async def consume(loop: EngineLoop):
        return [i async for i in loop.stream(produce)]

    assert run_with_loop(consume) == list(range(20))
