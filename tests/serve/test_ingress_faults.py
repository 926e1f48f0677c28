"""The ingress's fault handling on fake engine streams (no Ray cluster): a lost replica before the first
item is routed again once, then 503; after it, the stream ends with an explicit error, never a cut."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from ray.exceptions import ActorDiedError

from serve_app.backpressure import LanesFull, Shed, ShedReason
from serve_app.engine_backend import Chunk, EngineError, GenerateRequest
from serve_app.errors import OpenAIError
from serve_app.ingress import Ingress
from serve_app.route_records import RouteHint, RouteTicket

IngressClass = Ingress.func_or_class
REQUEST = GenerateRequest(rid="r1", prompt_text="hi", prompt_tokens=1, max_tokens=3)


class FakeStream:
    """An engine call: yields `items`, raising any that is an exception."""

    def __init__(self, items: list) -> None:
        self.items = list(items)
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.items:
            raise StopAsyncIteration
        item = self.items.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> None:
        self.cancelled = True


class Counter:
    def __init__(self) -> None:
        self.tags: list[dict] = []

    def inc(self, tags: dict) -> None:
        self.tags.append(tags)


def fake_ingress(streams: list[FakeStream]) -> SimpleNamespace:
    calls = iter(streams)
    metrics = SimpleNamespace(shed=Counter(), observe_ttft=lambda *a: None, observe_itl=lambda *a: None)
    ingress = SimpleNamespace(
        engine_stream=SimpleNamespace(generate=SimpleNamespace(remote=lambda req, route: next(calls))),
        metrics=metrics,
    )
    ingress._map_error = lambda e: IngressClass._map_error(ingress, e)
    return ingress


def start(ingress, ticket: RouteTicket):
    send = lambda t: ingress.engine_stream.generate.remote(REQUEST, route=t)  # noqa: E731  (as `_serve` sends)
    return asyncio.run(IngressClass._start(ingress, send, ticket))


def test_replica_lost_before_the_first_item_is_routed_again() -> None:
    lost, ok = FakeStream([ActorDiedError()]), FakeStream([Chunk(text="a", cached_tokens=0, completion_tokens=1)])
    ticket = RouteTicket(RouteHint(session_id="s", prompt_tokens=1))
    stream, first, used = start(fake_ingress([lost, ok]), ticket)
    assert stream is ok and first.text == "a" and lost.cancelled
    assert used is not ticket and used.hint == ticket.hint  # a fresh ticket: the router decides anew


def test_replica_lost_twice_is_503_with_a_message() -> None:
    ingress = fake_ingress([FakeStream([ActorDiedError()]), FakeStream([ActorDiedError()])])
    with pytest.raises(OpenAIError) as e:
        start(ingress, RouteTicket(RouteHint(session_id=None, prompt_tokens=1)))
    assert e.value.status == 503 and e.value.code == "engine_replica_lost" and e.value.headers["Retry-After"]
    assert ingress.metrics.shed.tags == [{"reason": "replica-lost"}]


def test_engine_backpressure_is_429_with_its_retry_after() -> None:
    shed = EngineError(429, "Every engine replica has ...", "rate_limit_exceeded", 7)
    ingress = fake_ingress([FakeStream([shed])])
    with pytest.raises(OpenAIError) as e:
        start(ingress, RouteTicket(RouteHint(session_id=None, prompt_tokens=1)))
    assert (e.value.status, e.value.code, e.value.type) == (429, "rate_limit_exceeded", "rate_limit_exceeded")
    assert e.value.headers == {"Retry-After": "7"}


def test_a_request_the_router_shed_is_429_with_the_routers_answer() -> None:
    shed = Shed(429, ShedReason.PREFILL_TOKENS, 12, "Every engine replica has more than 100 prompt tokens queued")
    ingress = fake_ingress([FakeStream([LanesFull(shed)])])
    with pytest.raises(OpenAIError) as e:
        start(ingress, RouteTicket(RouteHint(session_id=None, prompt_tokens=1)))
    assert (e.value.status, e.value.code, e.value.headers) == (429, "rate_limit_exceeded", {"Retry-After": "12"})
    assert e.value.message == shed.message
    assert ingress.metrics.shed.tags == [{"reason": "router-queued-prefill-tokens"}]


@pytest.mark.parametrize(
    ("failure", "status"),
    [(ActorDiedError(), 503), (RuntimeError("engine bug"), 500)],
)
def test_a_failure_mid_stream_ends_with_an_engine_error(failure: BaseException, status: int) -> None:
    first = Chunk(text="a", cached_tokens=0, completion_tokens=1)
    stream = FakeStream([Chunk(text="b", completion_tokens=2), failure, Chunk(text="never", completion_tokens=3)])
    ingress = fake_ingress([])
    call = SimpleNamespace(first_item_s=None, received_s=0.0, lane="chat", traffic_class="short")

    async def items():
        return [i async for i in IngressClass._items(ingress, stream, first, call)]

    got = asyncio.run(items())
    assert [getattr(i, "text", None) for i in got[:2]] == ["a", "b"]
    assert isinstance(got[-1], EngineError) and got[-1].status == status and len(got) == 3
