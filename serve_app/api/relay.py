"""The engine's answer on its way to the client, one path for every backend: the engine call started (routed
again once if its replica is lost before any of its tokens reached the client), then the response the engine
wrote relayed as it comes, whole or streamed.

Before the first token. A stream's first items may carry no token: sglang sends the response's head as soon as it
accepts the request, and its opening role event carries none either; a document's prefill can take seconds after
them. Those items are held back (`opening`: neither the status line nor any byte reaches the client) until the
first item that carries output, so a replica lost while they are held loses nothing the client saw: the request
is placed again on another replica (counted in `fairshare_requests_replaced_total`) and the client gets one normal
response, its headers from the replica that served it. Nothing is relayed twice: what was held is dropped.

Errors: a refusal before the response started is an OpenAI error response (the router's or the replica's
backpressure 429 with `Retry-After`, 503 with no replica or a replica lost twice); once a stream started, a
replica lost or an engine failure ends it with an SSE error event and `[DONE]`, never a cut. Metrics: TTFT and
ITL are observed from the relayed bytes (`StreamTimer`, counting the events that carry text); each request is
counted once, with the status it ended with; a response that ended normally is judged once against its class's
SLO targets on the replica that served it, from the same observations. Cancellation: a client gone cancels the
engine call, which aborts the request in the engine.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

from fastapi.responses import Response
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentResponseGenerator

from serve_app.api.endpoints import Endpoint
from serve_app.api.request_count import counting
from serve_app.api.routed_call import RoutedCall
from serve_app.metrics import IngressMetrics, ServedTokens, StreamTimer
from serve_app.protocol.errors import OpenAIError
from serve_app.protocol.sse import output_events
from serve_app.replica.backend import (
    SSE,
    EngineError,
    ResponseBody,
    ResponseItem,
    ResponsePart,
    ResponseStart,
    carries_output,
)
from serve_app.routing.backpressure import LanesFull
from serve_app.routing.records import RouteTicket

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 1
START_ATTEMPTS = 2
"""A request whose replica dies before its first token is routed again once (nothing reached the client)."""
REPLICA_LOST = (RayActorError, ActorUnavailableError)
FAILED_MESSAGE = "The engine failed while serving this request."

EngineCall = DeploymentResponseGenerator[Any]
"""A streaming call to the engine deployment: its items are lists of `ResponseItem`s."""
Send = Callable[[RouteTicket], EngineCall]
"""Sends the request to the engine lanes with this ticket (the router records its decision on it)."""


def cancel(stream: EngineCall) -> None:
    """Cancel an engine call (aborts the request in the engine). Serve's `cancel()` re-raises the
    call's own failure when it already failed; there is nothing left to cancel then."""
    try:
        stream.cancel()
    except Exception:
        logger.debug("engine call had already failed", exc_info=True)


def replica_lost_error() -> OpenAIError:
    return OpenAIError.retry_later(
        503,
        "The engine replica serving this request stopped; Serve is replacing it. Retry the request.",
        RETRY_AFTER_S,
        code="engine_replica_lost",
    )


def engine_error(item: EngineError) -> OpenAIError:
    """The replica's own refusal (backpressure: 429 with its `Retry-After`)."""
    error = OpenAIError.of_status(item.status, item.message)
    error.code = item.code
    if item.status == 429:
        error.type = "rate_limit_exceeded"
    if item.retry_after_s is not None:
        error.headers["Retry-After"] = str(item.retry_after_s)
    return error


def call_error(e: BaseException, metrics: IngressMetrics, tenant: str, what: str = "engine lanes") -> BaseException:
    """What the client hears when a call to a deployment (`what`) failed before answering: a shed request's 429,
    503 without a replica, or `e` itself (a bug: 500). Sheds are counted against the request's `tenant`."""
    if isinstance(e, LanesFull):
        metrics.count_shed(f"router-{e.shed.reason.value}", tenant)
        return e.shed.error()
    if isinstance(e, BackPressureError):
        metrics.count_shed("backpressure", tenant)
        return OpenAIError.retry_later(429, f"The {what} are full; retry shortly.", RETRY_AFTER_S)
    if isinstance(e, DeploymentUnavailableError):
        metrics.count_shed("unavailable", tenant)
        message = "No engine replica is available." if what == "engine lanes" else f"No replica is available ({what})."
        return OpenAIError.retry_later(503, message, RETRY_AFTER_S)
    if isinstance(e, REPLICA_LOST):
        metrics.count_shed("replica-lost", tenant)
        return replica_lost_error()
    if isinstance(e, StopAsyncIteration):
        return OpenAIError(500, "The engine closed the stream.", type="server_error")
    return e


def awaits_output(items: Sequence[ResponseItem], text_field: str) -> bool:
    """A stream's items so far are only its head and events without output: nothing yet worth the client's bytes.
    A refusal, an error status or a whole (JSON) response goes on as it is."""
    head = items[0] if items else None
    if not isinstance(head, ResponseStart) or head.media_type != SSE or head.status >= 400:
        return False
    return not carries_output(items, text_field)


async def opening(stream: EngineCall, text_field: str) -> list[ResponseItem]:
    """The engine's items up to and with the first that carries output (or to the stream's end), joined: what is
    held back from the client until a token exists (the module's docstring says why)."""
    items: list[ResponseItem] = list(await stream.__anext__())
    while awaits_output(items, text_field):
        try:
            items += await stream.__anext__()
        except StopAsyncIteration:
            break  # a stream without output: what it wrote goes on, and the relay finds the end again
    return items


async def start(
    send: Send, ticket: RouteTicket, metrics: IngressMetrics, text_field: str
) -> tuple[EngineCall, ResponseStart, Sequence[ResponseItem], RouteTicket]:
    """Send the request to the engine lanes; return the stream, the response's head, its opening items (the head
    and every byte up to its first output: `opening`) and the ticket it was routed with. `text_field`: the field
    of the endpoint's stream events that carries text (`content`, `text`)."""
    tenant = ticket.hint.tenant
    for attempt in range(1, START_ATTEMPTS + 1):
        stream: EngineCall | None = None
        try:
            # Serve raises BackPressureError from `.remote()` itself or from the first item.
            stream = send(ticket)
            first = await opening(stream, text_field)
        except REPLICA_LOST as e:
            if stream is not None:
                cancel(stream)
            if attempt == START_ATTEMPTS:
                raise call_error(e, metrics, tenant) from None
            # Nothing reached the client (`opening` held it back): the request goes whole to another replica.
            logger.warning("engine replica lost before the first token (%s); routing again", type(e).__name__)
            metrics.count_replaced()
            ticket = RouteTicket(ticket.hint)
            continue
        except BaseException as e:
            if stream is not None:
                cancel(stream)
            raise call_error(e, metrics, tenant) from None
        head = first[0] if first else None
        if isinstance(head, EngineError):
            if head.status == 429:
                metrics.count_shed("engine-limit", tenant)
            raise engine_error(head)
        if not isinstance(head, ResponseStart):
            cancel(stream)
            raise RuntimeError(f"the engine's first item has no response head: {first!r}")
        return stream, head, first, ticket
    raise AssertionError("unreachable: the last attempt returns or raises")


async def _arrivals(
    stream: EngineCall, first: Sequence[ResponseItem], first_s: float
) -> AsyncGenerator[tuple[ResponseBody, float], None]:
    """The response's bodies as they come (the first item's included), with when each arrived. The replica joins
    what is ready together into one body per stream item (`engine_replica.respond`)."""
    item, at_s = first, first_s
    while True:
        for part in item:
            if isinstance(part, ResponseBody):
                yield part, at_s
        try:
            item = await stream.__anext__()
        except StopAsyncIteration:
            return
        at_s = time.perf_counter()


async def relay(
    stream: EngineCall,
    first: Sequence[ResponseItem],
    call: RoutedCall,
    endpoint: Endpoint,
    metrics: IngressMetrics,
) -> AsyncIterator[bytes]:
    """A streamed response's bytes as they come. A replica lost or an engine failure mid-stream ends it with an
    SSE error event and `[DONE]`; the client going away cancels the engine call."""
    timer = StreamTimer(metrics, call.lane, call.traffic_class, call.received_s, call.slo)
    usage = ServedTokens(metrics, call.tenant)
    with counting(metrics, endpoint.name, unfinished="499") as outcome:
        try:
            status = 200
            arrivals = _arrivals(stream, first, call.first_item_s or call.received_s)
            try:
                async with contextlib.aclosing(arrivals):
                    async for body, at_s in arrivals:
                        timer.tokens(output_events(body.data, endpoint.text_field), at_s)
                        usage.seen(body.data)
                        status = body.error_status or status
                        yield body.data
            except REPLICA_LOST as e:
                # Only this replica's requests fail; the client hears why instead of a cut connection.
                logger.warning("engine replica lost mid-stream: %s", type(e).__name__)
                outcome.status = "503"
                yield replica_lost_error().stream_end()
                return
            except Exception:
                logger.exception("engine call failed mid-stream")
                outcome.status = "500"
                yield OpenAIError.of_status(500, FAILED_MESSAGE).stream_end()
                return
            outcome.status = str(status)
            if status == 200:
                timer.finish()
        finally:
            usage.count()
            if outcome.status == "499":
                cancel(stream)


async def whole_body(
    stream: EngineCall,
    first: Sequence[ResponseItem],
    call: RoutedCall,
    endpoint: Endpoint,
    metrics: IngressMetrics,
    *,
    timed: bool,
) -> bytes:
    """A whole response's bytes. Its tokens reach the client with it: with `timed` (a 2xx answer), TTFT is
    observed at its arrival, as for a stream's first text, and the request is judged against its targets (its
    tokens arrive together: no gap between them). A replica lost or an engine failure before it is
    complete is a 503 or a 500."""
    parts: list[bytes] = []
    arrived_s = call.first_item_s or call.received_s
    arrivals = _arrivals(stream, first, arrived_s)
    try:
        async with contextlib.aclosing(arrivals):
            async for body, at_s in arrivals:
                parts.append(body.data)
                arrived_s = at_s
    except REPLICA_LOST as e:
        logger.warning("engine replica lost mid-response: %s", type(e).__name__)
        raise replica_lost_error() from None
    except Exception:
        logger.exception("engine call failed mid-response")
        raise OpenAIError.of_status(500, FAILED_MESSAGE) from None
    data = b"".join(parts)
    if timed:
        timer = StreamTimer(metrics, call.lane, call.traffic_class, call.received_s, call.slo)
        timer.tokens(output_events(data, endpoint.text_field), arrived_s)
        timer.finish()
        served = ServedTokens(metrics, call.tenant)
        served.seen(data)
        served.count()
    return data


def response_of(parts: Sequence[ResponsePart]) -> Response:
    """A response a deployment returned whole (`ResponseStart`, then its body)."""
    head = parts[0]
    assert isinstance(head, ResponseStart)
    body = b"".join(part.data for part in parts[1:] if isinstance(part, ResponseBody))
    return Response(body, status_code=head.status, media_type=head.media_type)
