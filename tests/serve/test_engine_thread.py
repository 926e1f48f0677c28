"""Engine-loop streams hand over what is ready in batches; the engine replica relays a batch's bytes as one item."""

from __future__ import annotations

import asyncio
import itertools
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serve_app.engines.sglang.engine_thread import EngineThread
from serve_app.replica.backend import ResponseBody, ResponseStart, joined_bodies

ITEMS = st.lists(
    st.one_of(
        st.builds(ResponseBody, st.binary(max_size=8), st.none() | st.sampled_from([500, 503])),
        st.just(ResponseStart(200, "text/event-stream")),
        st.just(ResponseStart(400, "application/json")),
    ),
    max_size=12,
)


def _runs(items) -> list[list[ResponseBody]]:
    runs: list[list[ResponseBody]] = []
    for a, b in itertools.pairwise([None, *items]):
        if isinstance(b, ResponseBody):
            if isinstance(a, ResponseBody):
                runs[-1].append(b)
            else:
                runs.append([b])
    return runs


@given(items=ITEMS)
def test_joined_bodies_keep_every_byte_every_other_item_and_each_runs_error_in_order(items) -> None:
    joined = joined_bodies(items)

    def others(xs):
        return [i for i in xs if not isinstance(i, ResponseBody)]

    def data(xs):
        return b"".join(i.data for i in xs if isinstance(i, ResponseBody))

    assert others(joined) == others(items) and data(joined) == data(items)
    assert not any(isinstance(a, ResponseBody) and isinstance(b, ResponseBody) for a, b in itertools.pairwise(joined))
    last_errors = [next((b.error_status for b in reversed(run) if b.error_status), None) for run in _runs(items)]
    assert [b.error_status for b in joined if isinstance(b, ResponseBody)] == last_errors


def run_with_loop(consume):
    loop = EngineThread()
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

    async def consume(loop: EngineThread):
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

    async def consume(loop: EngineThread):
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

    async def consume(loop: EngineThread):
        return [i async for i in loop.stream(produce)]

    assert run_with_loop(consume) == list(range(20))
