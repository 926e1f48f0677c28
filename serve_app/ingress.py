"""The OpenAI-compatible ingress: validate, count the prompt, read the session, hand off to the engine lanes.

Chat and completions run one pipeline (`Ingress._serve`); `endpoints` says how each renders its prompt
and writes its responses (sim backend: a documented subset of fields, a 400 naming any other). With the
sglang backend the engine writes the response itself (sglang's OpenAI serving classes, every field they
support): the ingress routes the client's request unchanged and relays the engine's bytes
(`Ingress._pass_through`). `/v1/embeddings` goes to the `Embedder` deployment, chosen by model name;
`/v1/models` lists each model with its kind. Every error is an OpenAI error body (400 bad input, 404
unknown model or route, 429 + Retry-After when the engine lanes are full (the lane router sheds when
every replica its lanes allow is over a backpressure limit; a replica over its limit on arrival answers
the same), 503 with no replica, the engine's status when it refuses or aborts a request, 500 otherwise,
never a stack trace); once a stream has started, an error
is an SSE error event followed by `[DONE]`. Every answered request, errors included, is counted in
`fairshare_requests_total`. Responses carry `X-Lane`, `X-Replica`, `X-Session-ID`, `X-Route`,
`X-Traffic-Class`, `Server-Timing` and `X-Request-ID`.

In front of the routes, plain ASGI middlewares (outermost first): the request id (`request_log`), the
optional API key (`auth`), the body guard (`request_rules`: size, UTF-8, JSON). An engine replica that
dies under a request fails only that request: 503 before the first byte (after one re-route), an SSE
error event then `[DONE]` once streaming.
"""

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.exceptions import HTTPException as StarletteHTTPException

from scheduler.slo import NOT_JUDGED, SloTargets
from serve_app.auth import ApiKeyMiddleware, process_api_key
from serve_app.backpressure import LanesFull
from serve_app.config import AppConfig, RoutingKnobs, validate
from serve_app.endpoints import CHAT, COMPLETIONS, Endpoint, ResponseIds
from serve_app.engine_backend import Chunk, EngineError, GenerateRequest, ResponseBody, ResponseStart
from serve_app.metrics import IngressMetrics, StreamTimer
from serve_app.protocol import EventTemplate, OpenAIError, Usage, now_s, sse, token_events
from serve_app.request_log import RequestIdMiddleware, configure_logging
from serve_app.request_rules import (
    SESSION_HEADER,
    RequestBodyGuard,
    check_context_window,
    parse_request,
    parse_session_id,
    validation_error,
)
from serve_app.route_records import RouteDecision, RouteHint, RouteTicket
from serve_app.tokenizer import make_tokenizer

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 1
START_ATTEMPTS = 2
"""A request whose replica dies before its first item is routed again once (nothing reached the client)."""
REPLICA_LOST = (RayActorError, ActorUnavailableError)
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
ENDPOINT_BY_PATH = {CHAT_PATH: CHAT.name, COMPLETIONS_PATH: COMPLETIONS.name, EMBEDDINGS_PATH: "embeddings"}
CHAT_KIND, EMBEDDING_KIND = "chat", "embedding"

api = FastAPI(title="fairshare-serve", docs_url=None, redoc_url=None)
# Starlette runs the last added outermost: every answer, 401 and 413 included, carries a request id.
api.add_middleware(RequestBodyGuard, max_body_bytes=lambda: api.state.max_body_bytes)
api.add_middleware(ApiKeyMiddleware, expected_key=process_api_key)  # read in the replica, not where the app was built
api.add_middleware(RequestIdMiddleware)  # behind Serve's proxy, which echoes the id in the response


@api.exception_handler(OpenAIError)
async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
    return exc.response()


def _counted(request: Request, response: JSONResponse) -> JSONResponse:
    """Count an error answered before a route ran (the routes count their own)."""
    endpoint = ENDPOINT_BY_PATH.get(request.url.path)
    metrics: IngressMetrics | None = getattr(request.app.state, "metrics", None)
    if endpoint is not None and metrics is not None:
        metrics.requests.inc(tags={"endpoint": endpoint, "status": str(response.status_code)})
    return response


@api.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return _counted(request, validation_error(exc.errors()).response())


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return OpenAIError(exc.status_code, str(exc.detail), type=kind).response()


@api.exception_handler(Exception)
async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error")
    return OpenAIError(500, "internal server error", type="server_error").response()


def _cancel(stream: DeploymentResponseGenerator) -> None:
    """Cancel an engine call (aborts the request in the engine). Serve's `cancel()` re-raises the
    call's own failure when it already failed; there is nothing left to cancel then."""
    try:
        stream.cancel()
    except Exception:
        logger.debug("engine call had already failed", exc_info=True)


# Module functions the Ingress class uses are defined above it: Serve pickles the class when it is
# decorated, and a name defined below it would be missing in the replica.
def _replica_lost_error() -> OpenAIError:
    return OpenAIError.retry_later(
        503,
        "The engine replica serving this request stopped; Serve is replacing it. Retry the request.",
        RETRY_AFTER_S,
        code="engine_replica_lost",
    )


def _session_of(request: Request, user: Any) -> str:
    """The session header, else the `user` field, else a fresh id."""
    # A `user` that is not a string is the engine's to refuse (sglang backend): it names no session.
    user_session = parse_session_id(user, "user") if isinstance(user, str) else None
    return parse_session_id(request.headers.get(SESSION_HEADER)) or user_session or f"sess-{uuid.uuid4().hex[:16]}"


def _engine_error(item: EngineError) -> OpenAIError:
    """The engine's own refusal (backpressure 429 with its `Retry-After`, a request it can never fit, ...)."""
    error = OpenAIError.of_status(item.status, item.message)
    error.code = item.code
    if item.status == 429:
        error.type = "rate_limit_exceeded"
    if item.retry_after_s is not None:
        error.headers["Retry-After"] = str(item.retry_after_s)
    return error


def _whole_response(items: list[ResponseStart | ResponseBody]) -> Response:
    """A response the engine wrote whole (`ResponseStart`, then its body)."""
    head = items[0]
    assert isinstance(head, ResponseStart)
    body = b"".join(item.data for item in items[1:] if isinstance(item, ResponseBody))
    return Response(body, status_code=head.status, media_type=head.media_type)


class _Outcome:
    """The status a request is counted with in `fairshare_requests_total`, set as it is answered."""

    STREAMING = "streaming"
    """Handed to a response stream, which counts the request itself when it ends."""

    def __init__(self, status: str) -> None:
        self.status = status

    @property
    def handed_over(self) -> bool:
        return self.status == self.STREAMING


@contextlib.contextmanager
def _counting(metrics: IngressMetrics, endpoint: str, unfinished: str = "500") -> Iterator[_Outcome]:
    """Count one request once: with the status the block set, an `OpenAIError`'s status, 499 when the client went
    away (the task cancelled), else `unfinished` (500 for a handler: a bug; 499 for a stream closed early)."""
    outcome = _Outcome(unfinished)
    try:
        yield outcome
    except OpenAIError as e:
        outcome.status = str(e.status)
        raise
    except asyncio.CancelledError:
        outcome.status = "499"
        raise
    finally:
        if not outcome.handed_over:
            metrics.requests.inc(tags={"endpoint": endpoint, "status": outcome.status})


class _Call:
    """One request on its way through: ids, its route once decided, timing."""

    def __init__(self, ids: ResponseIds, session_id: str, prompt_tokens: int, received_s: float) -> None:
        self.ids = ids
        self.session_id = session_id
        self.prompt_tokens = prompt_tokens
        self.received_s = received_s
        self.decision: RouteDecision | None = None
        self.routed_s: float | None = None
        self.first_item_s: float | None = None
        self.cached_tokens = 0

    @property
    def lane(self) -> str:
        return self.decision.lane.value if self.decision else ""

    @property
    def traffic_class(self) -> str:
        return self.decision.traffic_class.value if self.decision else ""

    @property
    def slo(self) -> SloTargets:
        """The targets the request is judged by (its class's on the replica that serves it)."""
        return self.decision.slo if self.decision else NOT_JUDGED

    def routed(self, ticket: RouteTicket, cached_tokens: int | None) -> None:
        self.decision, self.routed_s = ticket.decision, ticket.decided_at_s
        self.first_item_s = time.perf_counter()
        self.cached_tokens = cached_tokens or 0

    def usage(self, completion_tokens: int) -> Usage:
        return Usage.of(self.prompt_tokens, completion_tokens, self.cached_tokens)

    def server_timing(self) -> str:
        """`route`: receipt to the router's decision (tokenizing, routing). `ttft`: receipt to the engine's first
        item (also the handle hop and the engine's first pass: with a zero-cost engine, the serving overhead)."""
        parts = []
        if self.routed_s is not None:
            parts.append(f"route;dur={(self.routed_s - self.received_s) * 1000:.3f}")
        if self.first_item_s is not None:
            parts.append(f"ttft;dur={(self.first_item_s - self.received_s) * 1000:.3f}")
        return ", ".join(parts)

    def headers(self) -> dict[str, str]:
        d = self.decision
        return {
            "X-Lane": self.lane,
            "X-Replica": d.replica_id if d else "",
            "X-Session-ID": self.session_id,
            "X-Route": d.reason.value if d else "",
            "X-Traffic-Class": self.traffic_class,
            "Server-Timing": self.server_timing(),
        }


@serve.deployment(name="Ingress")
@serve.ingress(api)
class Ingress:
    def __init__(
        self, engine: DeploymentHandle, app_config: dict[str, Any], embedder: DeploymentHandle | None = None
    ) -> None:
        self.cfg: AppConfig = validate(AppConfig, app_config, "args")
        self.model_id = self.cfg.served_model_id
        self.embedder = embedder
        self.model_kinds = {self.model_id: CHAT_KIND}
        if self.cfg.embeddings is not None:
            self.model_kinds[self.cfg.embeddings.served_model_id] = EMBEDDING_KIND
        self.tokenizer = make_tokenizer(self.cfg)
        self.engine_stream = engine.options(stream=True)
        self.engine = engine
        self.knobs = RoutingKnobs()
        self.metrics = IngressMetrics()
        api.state.metrics = self.metrics  # the exception handlers count the requests they answer
        api.state.max_body_bytes = self.cfg.request_bytes_limit
        process_api_key()  # a bad FAIRSHARE_API_KEY[_FILE] stops the replica at start, naming the variable
        configure_logging()

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self.knobs = validate(RoutingKnobs, user_config, "Ingress.user_config")
        logger.info("routing knobs: %s", self.knobs.model_dump())

    # -- routes ----------------------------------------------------------------------------
    @api.get("/health")
    async def health(self) -> dict[str, str]:
        return {"status": "ok", "model": self.model_id}

    @api.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        cards = [
            {"id": model, "object": "model", "created": 0, "owned_by": "fairshare-serve", "kind": kind}
            for model, kind in self.model_kinds.items()
        ]
        return {"object": "list", "data": cards}

    @api.get("/admin/replicas/{replica_id}")
    async def replica(self, replica_id: str) -> dict[str, Any]:
        hint = RouteHint(session_id=None, prompt_tokens=1, knobs=self.knobs, target_replica=replica_id)
        info = await self.engine.describe.remote(route=RouteTicket(hint))
        if info.get("replica") != replica_id:
            raise OpenAIError(404, f"no engine replica {replica_id!r}", type="not_found_error")
        return info

    @api.post(CHAT_PATH)
    async def chat_completions(self, request: Request) -> Response:
        return await self._serve(CHAT, request)

    @api.post(COMPLETIONS_PATH)
    async def completions(self, request: Request) -> Response:
        return await self._serve(COMPLETIONS, request)

    @api.post(EMBEDDINGS_PATH)
    async def embeddings(self, request: Request) -> Response:
        with _counting(self.metrics, "embeddings") as outcome:
            raw = await request.json()
            self._check_model(raw.get("model"), EMBEDDING_KIND)
            assert self.embedder is not None  # a model of kind embedding exists only with an Embedder
            try:
                items = await self.embedder.embed.remote(raw, f"embd-{uuid.uuid4().hex}")
            except BaseException as e:
                raise self._map_error(e, "embedding replicas") from None
            response = _whole_response(items)
            outcome.status = str(response.status_code)
            return response

    # -- the one pipeline --------------------------------------------------------------------
    def _check_model(self, model: Any, kind: str) -> None:
        if not isinstance(model, str):
            raise OpenAIError(400, "model: a model id (string) is required.", param="model")
        served = self.model_kinds.get(model)
        if served is None:
            raise OpenAIError(
                404,
                f"The model {model!r} does not exist; this server serves {sorted(self.model_kinds)}.",
                type="not_found_error",
                code="model_not_found",
                param="model",
            )
        if served != kind:
            raise OpenAIError(
                400,
                f"The model {model!r} is a {served} model; this endpoint needs a {kind} model.",
                param="model",
                code="wrong_model_kind",
            )

    def _prepare(self, endpoint: Endpoint, body: Any, request: Request, received_s: float):
        """Validate what the schema cannot, count the prompt, and build the engine request and its route."""
        self._check_model(body.model, CHAT_KIND)
        prompt = endpoint.prompt(body, self.tokenizer)
        token_ids = self.tokenizer.encode(prompt)
        prompt_tokens = len(token_ids) if token_ids is not None else self.tokenizer.count(prompt)
        max_tokens = body.output_limit or self.cfg.default_max_tokens
        check_context_window(prompt_tokens, max_tokens, self.cfg.context_limit_tokens, endpoint.prompt_param)
        session_id = _session_of(request, body.user)
        ids = ResponseIds(f"{endpoint.id_prefix}-{uuid.uuid4().hex}", now_s(), self.model_id)
        gen_req = GenerateRequest(
            rid=ids.id,
            prompt_text=prompt,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            session_id=session_id,
            prompt_token_ids=token_ids,
            stop=body.stop_sequences,
            temperature=1.0 if body.temperature is None else body.temperature,
        )
        hint = RouteHint(session_id=session_id, prompt_tokens=prompt_tokens, knobs=self.knobs, request_id=ids.id)
        return _Call(ids, session_id, prompt_tokens, received_s), gen_req, RouteTicket(hint)

    async def _serve(self, endpoint: Endpoint, request: Request) -> Response:
        if self.cfg.backend == "sglang":
            return await self._pass_through(endpoint, request)
        received_s = time.perf_counter()
        stream: DeploymentResponseGenerator | None = None
        with _counting(self.metrics, endpoint.name) as outcome:
            try:
                raw = await request.json()
                body = parse_request(endpoint.request_model, raw, f"{endpoint.name} on the sim backend")
                call, gen_req, ticket = self._prepare(endpoint, body, request, received_s)
                stream, first, ticket = await self._start(
                    lambda t: self.engine_stream.generate.remote(gen_req, route=t), ticket
                )
                call.routed(ticket, first.cached_tokens)
                if body.stream:
                    outcome.status = _Outcome.STREAMING
                    sse_events = self._sse(endpoint, stream, first, call, body.include_usage)
                    return StreamingResponse(sse_events, media_type="text/event-stream", headers=call.headers())
                response = await self._collect(endpoint, stream, first, call)
                outcome.status = "200"
                return response
            finally:
                # Unanswered (an error, the client gone): cancel the engine call. A finished one needs no round trip.
                if stream is not None and outcome.status not in ("200", _Outcome.STREAMING):
                    _cancel(stream)

    async def _routing_tokens(self, endpoint: Endpoint, raw: dict[str, Any]) -> int:
        """The prompt's token count for routing. The model's tokenizer runs on a worker thread: inline, it held this
        replica's event loop, which serves every other stream here, for ~1 s on an 800k-character document."""
        if self.tokenizer.blocking:
            return await asyncio.to_thread(self._count_routing_prompt, endpoint, raw)
        return self._count_routing_prompt(endpoint, raw)

    def _count_routing_prompt(self, endpoint: Endpoint, raw: dict[str, Any]) -> int:
        prompt = endpoint.routing_prompt(raw, self.tokenizer)
        return self.tokenizer.count(prompt) if prompt else 1

    async def _pass_through(self, endpoint: Endpoint, request: Request) -> Response:
        """sglang backend: route the client's request as it came, relay the engine's own response (status, JSON
        or SSE bytes). Client disconnect cancels the engine call, which aborts the request in sglang."""
        received_s = time.perf_counter()
        stream: DeploymentResponseGenerator | None = None
        consumed = False  # the engine's whole answer was read: nothing left to cancel
        with _counting(self.metrics, endpoint.name) as outcome:
            try:
                raw = await request.json()
                self._check_model(raw.get("model"), CHAT_KIND)
                prompt_tokens = await self._routing_tokens(endpoint, raw)
                session_id = _session_of(request, raw.get("user"))
                rid = f"{endpoint.id_prefix}-{uuid.uuid4().hex}"
                hint = RouteHint(session_id=session_id, prompt_tokens=prompt_tokens, knobs=self.knobs, request_id=rid)
                call = _Call(ResponseIds(rid, now_s(), self.model_id), session_id, prompt_tokens, received_s)
                stream, head, ticket = await self._start(
                    lambda t: self.engine_stream.respond.remote(
                        endpoint.name, raw, rid, session_id, prompt_tokens, route=t
                    ),
                    RouteTicket(hint),
                )
                call.routed(ticket, None)
                if head.media_type == "text/event-stream" and head.status < 400:
                    outcome.status = _Outcome.STREAMING
                    relay = self._relay(endpoint, stream, call)
                    return StreamingResponse(
                        relay, status_code=head.status, media_type=head.media_type, headers=call.headers()
                    )
                # sglang writes a whole response at once: no token timing to observe.
                body = b"".join([item.data async for item in stream if isinstance(item, ResponseBody)])
                consumed = True
                outcome.status = str(head.status)
                return Response(body, status_code=head.status, media_type=head.media_type, headers=call.headers())
            finally:
                if stream is not None and not consumed and not outcome.handed_over:
                    _cancel(stream)

    async def _relay(
        self, endpoint: Endpoint, stream: DeploymentResponseGenerator, call: _Call
    ) -> AsyncIterator[bytes]:
        """The engine's SSE bytes as they come; a replica lost mid-stream ends it with an error event and [DONE].
        TTFT and ITL are observed as for the sim backend, counting the events that carry text (no JSON decoding)."""
        timer = StreamTimer(self.metrics, call.lane, call.traffic_class, call.received_s, call.slo)
        with _counting(self.metrics, endpoint.name, unfinished="499") as outcome:
            try:
                while True:
                    try:
                        item = await stream.__anext__()
                    except StopAsyncIteration:
                        outcome.status = "200"
                        timer.finish()
                        return
                    except REPLICA_LOST:
                        outcome.status = "503"
                        yield (sse(_replica_lost_error().body()) + sse("[DONE]")).encode()
                        return
                    if isinstance(item, ResponseBody):
                        timer.tokens(token_events(item.data, endpoint.text_field), time.perf_counter())
                        yield item.data
            finally:
                if outcome.status == "499":
                    _cancel(stream)

    async def _start(self, send: Any, ticket: RouteTicket) -> tuple[DeploymentResponseGenerator, Any, RouteTicket]:
        """Send the request to the engine lanes; return the stream, its first chunk (cache, first tokens) and the
        ticket it was routed with. A replica lost before the first item costs one more routing, not the request."""
        for attempt in range(1, START_ATTEMPTS + 1):
            stream: DeploymentResponseGenerator | None = None
            try:
                # Serve raises BackPressureError from `.remote()` itself or from the first item.
                stream = send(ticket)
                item = await stream.__anext__()
            except REPLICA_LOST as e:
                if stream is not None:
                    _cancel(stream)
                if attempt == START_ATTEMPTS:
                    raise self._map_error(e) from None
                logger.warning("engine replica lost before the first item (%s); routing again", type(e).__name__)
                ticket = RouteTicket(ticket.hint)
                continue
            except BaseException as e:
                if stream is not None:
                    _cancel(stream)
                raise self._map_error(e) from None
            if isinstance(item, EngineError):
                if item.status == 429:
                    self.metrics.shed.inc(tags={"reason": "engine-limit"})
                raise _engine_error(item)
            return stream, item, ticket
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _map_error(self, e: BaseException, what: str = "engine lanes") -> BaseException:
        if isinstance(e, LanesFull):
            self.metrics.shed.inc(tags={"reason": f"router-{e.shed.reason.value}"})
            return e.shed.error()
        if isinstance(e, BackPressureError):
            self.metrics.shed.inc(tags={"reason": "backpressure"})
            return OpenAIError.retry_later(429, f"The {what} are full; retry shortly.", RETRY_AFTER_S)
        if isinstance(e, DeploymentUnavailableError):
            self.metrics.shed.inc(tags={"reason": "unavailable"})
            message = (
                "No engine replica is available." if what == "engine lanes" else f"No replica is available ({what})."
            )
            return OpenAIError.retry_later(503, message, RETRY_AFTER_S)
        if isinstance(e, REPLICA_LOST):
            self.metrics.shed.inc(tags={"reason": "replica-lost"})
            return _replica_lost_error()
        if isinstance(e, StopAsyncIteration):
            return OpenAIError(500, "The engine closed the stream.", type="server_error")
        return e

    async def _items(
        self, stream: DeploymentResponseGenerator, first: Chunk, call: _Call
    ) -> AsyncIterator[Chunk | EngineError]:
        """The engine's items, first one included, up to the last (finished or an error); TTFT and ITL recorded."""
        timer = StreamTimer(self.metrics, call.lane, call.traffic_class, call.received_s, call.slo)
        # The first item is the first token's arrival (TTFT) even if it carries none (e.g. held back by a stop match).
        timer.tokens(max(1, first.completion_tokens), call.first_item_s or time.perf_counter())
        yield first
        if first.finish_reason is not None:
            timer.finish()
            return
        n = first.completion_tokens
        while True:
            try:
                item = await stream.__anext__()
            except StopAsyncIteration:
                timer.finish()
                return
            except REPLICA_LOST as e:
                # Only this replica's requests fail; the client hears why instead of a cut connection.
                logger.warning("engine replica lost mid-request: %s", type(e).__name__)
                lost = _replica_lost_error()
                yield EngineError(503, lost.message, lost.code, RETRY_AFTER_S)
                return
            except Exception:
                logger.exception("engine call failed mid-request")
                yield EngineError(500, "The engine failed while serving this request.")
                return
            if isinstance(item, EngineError):
                yield item
                return
            timer.tokens(item.completion_tokens - n, time.perf_counter())
            n = item.completion_tokens
            yield item
            if item.finish_reason is not None:
                timer.finish()
                return

    async def _collect(
        self, endpoint: Endpoint, stream: DeploymentResponseGenerator, first: Chunk, call: _Call
    ) -> JSONResponse:
        parts: list[str] = []
        last = first
        async for item in self._items(stream, first, call):
            if isinstance(item, EngineError):
                raise _engine_error(item)
            parts.append(item.text)
            last = item
        body = endpoint.response(call.ids, "".join(parts), last.finish_reason, call.usage(last.completion_tokens))
        return JSONResponse(body.model_dump(), headers=call.headers())

    async def _sse(
        self, endpoint: Endpoint, stream: DeploymentResponseGenerator, first: Chunk, call: _Call, include_usage: bool
    ) -> AsyncIterator[str]:
        # Chunks carry `usage: null` only when the client asked for usage (OpenAI's shape).
        exclude = None if include_usage else {"usage"}
        with _counting(self.metrics, endpoint.name, unfinished="499") as outcome:
            try:
                # One write per engine item: the SSE events of an item go out together.
                events = [sse(e, exclude=exclude) for e in endpoint.opening(call.ids)]
                delta_event = EventTemplate(endpoint.delta(call.ids, EventTemplate.SLOT), exclude=exclude)
                async for item in self._items(stream, first, call):
                    if isinstance(item, EngineError):
                        # Headers are sent: the error goes in the stream, and the stream still ends properly.
                        events += [sse(_engine_error(item).body()), sse("[DONE]")]
                        outcome.status = str(item.status)
                    elif item.text:
                        events.append(delta_event(item.text))
                    if isinstance(item, Chunk) and item.finish_reason is not None:
                        events.append(sse(endpoint.finish(call.ids, item.finish_reason), exclude=exclude))
                        if include_usage:
                            events.append(sse(endpoint.usage(call.ids, call.usage(item.completion_tokens))))
                        events.append(sse("[DONE]"))
                        outcome.status = "200"
                    yield "".join(events)
                    events = []
            finally:
                # On client disconnect Serve cancels this task; cancelling the engine call aborts the
                # request in the engine (queue slot and KV freed).
                if outcome.status == "499":
                    _cancel(stream)
