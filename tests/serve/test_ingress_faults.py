"""The ingress's fault handling on fake engine streams (no Ray cluster): a lost replica before the first
token is routed again once, then 503; after it, the stream ends with an explicit error, never a cut."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError

from serve_app.api import relay
from serve_app.api.endpoints import CHAT
from serve_app.api.routed_call import RoutedCall
from serve_app.protocol.errors import OpenAIError
from serve_app.replica.backend import SSE, EngineError, OpenAIRequest, ResponseBody, ResponseStart
from serve_app.routing.backpressure import LanesFull, Shed, ShedReason
from serve_app.routing.records import RouteHint, RouteTicket

REQUEST = OpenAIRequest("chat", {"model": "m", "messages": []}, rid="r1", prompt_tokens=1)
HEAD = ResponseStart(200, SSE)


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
    shed, replaced = Counter(), Counter()
    metrics = SimpleNamespace(
        shed=shed,
        requests=Counter(),
        observe_ttft=lambda *a: None,
        observe_itl=lambda *a: None,
        count_shed=lambda reason, tenant: shed.inc(tags={"reason": reason, "tenant": tenant}),
        count_served=lambda *a: None,
        replaced=replaced,
        count_replaced=lambda: replaced.inc(tags={}),
    )
    return SimpleNamespace(
        engine_stream=SimpleNamespace(respond=SimpleNamespace(remote=lambda req, route: next(calls))),
        metrics=metrics,
    )


def start(ingress, ticket: RouteTicket):
    send = lambda t: ingress.engine_stream.respond.remote(REQUEST, route=t)  # noqa: E731  (as `_respond` sends)
    return asyncio.run(relay.start(send, ticket, ingress.metrics, CHAT.text_field))


ROLE = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
"""A chat stream's opening event: no token in it."""


def token(text: str) -> bytes:
    return b'data: {"choices":[{"delta":{"content":"' + text.encode() + b'"}}]}\n\n'


def test_replica_lost_before_the_first_item_is_routed_again() -> None:
    lost, ok = FakeStream([ActorDiedError()]), FakeStream([[HEAD, ResponseBody(token("a"))]])
    ticket = RouteTicket(RouteHint(session_id="s", prompt_tokens=1))
    ingress = fake_ingress([lost, ok])
    stream, head, first, used = start(ingress, ticket)
    assert stream is ok and head == HEAD and first[1].data == token("a") and lost.cancelled
    assert used is not ticket and used.hint == ticket.hint  # a fresh ticket: the router decides anew
    assert len(ingress.metrics.replaced.tags) == 1 and ingress.metrics.shed.tags == []


@pytest.mark.parametrize("lost_at", [ActorUnavailableError("gone", b"\0" * 16), ActorDiedError()])
def test_replica_lost_after_its_head_but_before_any_token_is_routed_again(lost_at: BaseException) -> None:
    """The head and the role event were held back: the client saw nothing, so the request goes whole to another
    replica, and only that replica's bytes reach the client (nothing twice)."""
    lost = FakeStream([[HEAD], [ResponseBody(ROLE)], lost_at])
    ok = FakeStream([[HEAD], [ResponseBody(ROLE)], [ResponseBody(token("a"))], [ResponseBody(token("b"))]])
    ingress = fake_ingress([lost, ok])
    stream, head, first, _ = start(ingress, RouteTicket(RouteHint(session_id="s", prompt_tokens=1)))
    assert stream is ok and head == HEAD and lost.cancelled
    assert first == [HEAD, ResponseBody(ROLE), ResponseBody(token("a"))]  # up to and with the first token
    assert ok.items == [[ResponseBody(token("b"))]]  # the rest is the relay's, as it comes
    assert len(ingress.metrics.replaced.tags) == 1


@pytest.mark.parametrize(
    ("items", "held"),
    [
        ([[HEAD, ResponseBody(ROLE + token("a"))], [ResponseBody(token("b"))]], 1),  # the sim: head, role, token
        ([[ResponseStart(200, "application/json")], [ResponseBody(b'{"choices":[]}')]], 1),  # whole: as it is
        ([[ResponseStart(400, SSE), ResponseBody(b'{"error":{}}')]], 1),  # an error status: as it is
        ([[HEAD], [ResponseBody(b"data: {}\n\n", error_status=503)], [ResponseBody(b"x")]], 2),  # the error event
        ([[HEAD], [ResponseBody(b'data: {"choices":[{"delta":{"tool_calls":[{}]}}]}\n\n')], [ResponseBody(b"")]], 2),
        ([[HEAD], [ResponseBody(ROLE)], [ResponseBody(b"data: [DONE]\n\n")]], 3),  # no output at all: to its end
    ],
)
def test_what_is_held_back_ends_at_the_first_output(items: list, held: int) -> None:
    stream = FakeStream(items)
    first = asyncio.run(relay.opening(stream, CHAT.text_field))
    assert first == [part for item in items[:held] for part in item]
    assert len(stream.items) == len(items) - held


def test_replica_lost_twice_is_503_with_a_message() -> None:
    ingress = fake_ingress([FakeStream([ActorDiedError()]), FakeStream([ActorDiedError()])])
    with pytest.raises(OpenAIError) as e:
        start(ingress, RouteTicket(RouteHint(session_id=None, prompt_tokens=1)))
    assert e.value.status == 503 and e.value.code == "engine_replica_lost" and e.value.headers["Retry-After"]
    assert ingress.metrics.shed.tags == [{"reason": "replica-lost", "tenant": "default"}]


def test_engine_backpressure_is_429_with_its_retry_after() -> None:
    shed = EngineError(429, "Every engine replica has ...", "rate_limit_exceeded", 7)
    ingress = fake_ingress([FakeStream([[shed]])])
    with pytest.raises(OpenAIError) as e:
        start(ingress, RouteTicket(RouteHint(session_id=None, prompt_tokens=1)))
    assert (e.value.status, e.value.code, e.value.type) == (429, "rate_limit_exceeded", "rate_limit_exceeded")
    assert e.value.headers == {"Retry-After": "7"}


def test_a_request_the_router_shed_is_429_with_the_routers_answer() -> None:
    shed = Shed(429, ShedReason.PREFILL_TOKENS, 12, "Every engine replica has more than 100 prompt tokens queued")
    ingress = fake_ingress([FakeStream([LanesFull(shed)])])
    with pytest.raises(OpenAIError) as e:
        start(ingress, RouteTicket(RouteHint(session_id=None, prompt_tokens=1, tenant="acme")))
    assert (e.value.status, e.value.code, e.value.headers) == (429, "rate_limit_exceeded", {"Retry-After": "12"})
    assert e.value.message == shed.message
    assert ingress.metrics.shed.tags == [{"reason": "router-queued-prefill-tokens", "tenant": "acme"}]


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [(ActorDiedError(), 503, "engine_replica_lost"), (RuntimeError("engine bug"), 500, None)],
)
def test_a_failure_mid_stream_ends_with_an_error_event_and_done(failure: BaseException, status: int, code) -> None:
    first = [HEAD, ResponseBody(b'data: {"a"}\n\n')]
    stream = FakeStream([[ResponseBody(b'data: {"b"}\n\n')], failure, [ResponseBody(b"never")]])
    ingress = fake_ingress([])
    call = RoutedCall("s", received_s=0.0)

    async def events():
        return b"".join([e async for e in relay.relay(stream, first, call, CHAT, ingress.metrics)])

    got = asyncio.run(events()).decode().split("\n\n")[:-1]
    assert got[:2] == ['data: {"a"}', 'data: {"b"}'] and got[-1] == "data: [DONE]" and len(got) == 4
    error = json.loads(got[2].removeprefix("data: "))["error"]
    assert (error["type"], error["code"]) == ("server_error", code)
    assert ingress.metrics.requests.tags == [{"endpoint": "chat", "status": str(status)}]
    assert not stream.cancelled  # the engine call already failed


def test_an_error_the_engine_wrote_mid_stream_counts_with_its_status() -> None:
    error_event = b'data: {"error": {"message": "aborted", "code": 503}}\n\ndata: [DONE]\n\n'
    stream = FakeStream([[ResponseBody(error_event, error_status=503)]])
    ingress = fake_ingress([])

    async def events():
        first = [HEAD, ResponseBody(b'data: {"a"}\n\n')]
        return b"".join([e async for e in relay.relay(stream, first, RoutedCall("s", 0.0), CHAT, ingress.metrics)])

    assert asyncio.run(events()).endswith(error_event)  # relayed as the engine wrote it
    assert ingress.metrics.requests.tags == [{"endpoint": "chat", "status": "503"}]


@pytest.mark.parametrize(
    ("failure", "status"),
    [(ActorDiedError(), 503), (RuntimeError("engine bug"), 500)],
)
def test_a_failure_before_a_whole_response_is_complete_is_an_error_response(failure, status: int) -> None:
    stream = FakeStream([failure])
    ingress = fake_ingress([])

    async def body():
        first = [ResponseStart(200, "application/json")]
        return await relay.whole_body(stream, first, RoutedCall("s", 0.0), CHAT, ingress.metrics, timed=True)

    with pytest.raises(OpenAIError) as e:
        asyncio.run(body())
    assert e.value.status == status and e.value.type == "server_error"
