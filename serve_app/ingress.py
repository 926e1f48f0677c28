"""The OpenAI-compatible ingress: validate, count the prompt, read the session, hand off to the engine lanes.

Every error is an OpenAI error body (400 bad input, 404 unknown model or route, 429 + Retry-After
when the engine lanes are full, 503 with no replica, 500 otherwise, never a stack trace). Responses
carry `X-Lane`, `X-Replica`, `X-Session-ID`, `X-Route` and `X-Traffic-Class`.
"""

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve_app.config import AppConfig, RoutingKnobs, validate
from serve_app.engine_backend import GenerateRequest
from serve_app.metrics import IngressMetrics
from serve_app.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    now_s,
    sse,
    usage,
)
from serve_app.routing import RouteHint
from serve_app.tokenizer import make_tokenizer

logger = logging.getLogger(__name__)

SESSION_HEADER = "X-Session-ID"
RETRY_AFTER_S = 1

api = FastAPI(title="fairshare-serve", docs_url=None, redoc_url=None)


@api.exception_handler(OpenAIError)
async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
    return exc.response()


@api.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    msgs = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}" for e in exc.errors()
    )
    return OpenAIError(400, msgs or "invalid request", param=".".join(loc) or None).response()


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


class _Call:
    """One request on its way through: ids, routing headers, timing."""

    def __init__(self, rid: str, session_id: str, prompt_tokens: int, received_s: float) -> None:
        self.rid = rid
        self.session_id = session_id
        self.prompt_tokens = prompt_tokens
        self.start: dict[str, Any] = {}
        self.received_s = received_s
        self.routed_s = received_s

    @property
    def lane(self) -> str:
        return self.start.get("lane", "")

    @property
    def traffic_class(self) -> str:
        return self.start.get("traffic_class", "")

    def headers(self) -> dict[str, str]:
        return {
            "X-Lane": self.lane,
            "X-Replica": self.start.get("replica", ""),
            "X-Session-ID": self.session_id,
            "X-Route": self.start.get("reason", ""),
            "X-Traffic-Class": self.traffic_class,
            # Ingress receipt to the engine's first item: routing, the hop and the engine's first pass.
            "Server-Timing": f"route;dur={(self.routed_s - self.received_s) * 1000:.3f}",
        }


@serve.deployment(name="Ingress")
@serve.ingress(api)
class Ingress:
    def __init__(self, engine: DeploymentHandle, app_config: dict[str, Any]) -> None:
        self.cfg: AppConfig = validate(AppConfig, app_config, "args")
        self.model_id = self.cfg.served_model_id
        self.tokenizer = make_tokenizer(self.cfg)
        self.engine_stream = engine.options(stream=True)
        self.engine = engine
        self.knobs = RoutingKnobs()
        self.metrics = IngressMetrics()

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self.knobs = validate(RoutingKnobs, user_config, "Ingress.user_config")
        logger.info("routing knobs: %s", self.knobs.model_dump())

    # -- routes ----------------------------------------------------------------------------
    @api.get("/health")
    async def health(self) -> dict[str, str]:
        return {"status": "ok", "model": self.model_id}

    @api.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.model_id, "object": "model", "created": 0, "owned_by": "fairshare-serve"}],
        }

    @api.get("/admin/replicas/{replica_id}")
    async def replica(self, replica_id: str) -> dict[str, Any]:
        hint = RouteHint(session_id=None, prompt_tokens=1, knobs=self.knobs, target_replica=replica_id)
        info = await self.engine.describe.remote(route=hint)
        if info.get("replica") != replica_id:
            raise OpenAIError(404, f"no engine replica {replica_id!r}", type="not_found_error")
        return info

    @api.post("/v1/chat/completions")
    async def chat_completions(self, body: ChatCompletionRequest, request: Request) -> Response:
        self._check_model(body.model)
        messages = [{"role": m.role, "content": m.text} for m in body.messages]
        prompt = self.tokenizer.render_chat(messages)
        return await self._serve(body, request, prompt, chat=True)

    @api.post("/v1/completions")
    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        self._check_model(body.model)
        return await self._serve(body, request, body.prompt_text, chat=False)

    # -- the common path -------------------------------------------------------------------
    def _check_model(self, model: str) -> None:
        if model != self.model_id:
            raise OpenAIError(
                404,
                f"The model {model!r} does not exist; this server serves {self.model_id!r}.",
                type="not_found_error",
                code="model_not_found",
                param="model",
            )

    async def _serve(self, body: ChatCompletionRequest | CompletionRequest, request: Request, prompt: str, chat: bool):
        received_s = time.perf_counter()
        token_ids = self.tokenizer.encode(prompt)
        prompt_tokens = len(token_ids) if token_ids is not None else self.tokenizer.count(prompt)
        max_tokens = body.output_limit or self.cfg.default_max_tokens
        limit = self.cfg.context_limit_tokens
        if limit is not None and prompt_tokens + max_tokens > limit:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {limit} tokens; the request has {prompt_tokens} prompt "
                f"tokens and max_tokens={max_tokens}.",
                code="context_length_exceeded",
                param="messages" if chat else "prompt",
            )
        session_id = request.headers.get(SESSION_HEADER) or body.user or f"sess-{uuid.uuid4().hex[:16]}"
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        call = _Call(rid, session_id, prompt_tokens, received_s)
        gen_req = GenerateRequest(
            rid=rid,
            prompt_text=prompt,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            session_id=session_id,
            prompt_token_ids=token_ids,
            stop=body.stop_sequences,
            temperature=1.0 if body.temperature is None else body.temperature,
        )
        hint = RouteHint(session_id=session_id, prompt_tokens=prompt_tokens, knobs=self.knobs, request_id=rid)
        stream, first = await self._start(gen_req, hint)
        call.start = first["start"]
        call.routed_s = time.perf_counter()
        if body.stream:
            return StreamingResponse(
                self._sse(stream, first, call, body, chat), media_type="text/event-stream", headers=call.headers()
            )
        completed = False
        try:
            response = await self._collect(stream, first, call, chat)
            completed = True
            return response
        finally:
            if not completed:  # cancelling a finished call would still cost a round trip
                _cancel(stream)
            self.metrics.requests.inc(
                tags={"endpoint": "chat" if chat else "completions", "status": "200" if completed else "499"}
            )

    async def _start(self, req: GenerateRequest, hint: RouteHint) -> tuple[DeploymentResponseGenerator, dict[str, Any]]:
        """Send the request to the engine lanes; return the stream and its first item (routing, cache, tokens)."""
        stream: DeploymentResponseGenerator | None = None
        try:
            # Serve raises BackPressureError from `.remote()` itself or from the first item.
            stream = self.engine_stream.generate.remote(req, route=hint)
            item = await stream.__anext__()
            if "error" in item:
                raise OpenAIError(item["error"]["status"], item["error"]["message"])
            return stream, item
        except BaseException as e:
            if stream is not None:
                _cancel(stream)
            raise self._map_error(e) from None

    def _map_error(self, e: BaseException) -> BaseException:
        if isinstance(e, BackPressureError):
            self.metrics.shed.inc(tags={"reason": "backpressure"})
            return OpenAIError(
                429,
                "The engine lanes are full; retry shortly.",
                type="rate_limit_exceeded",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        if isinstance(e, DeploymentUnavailableError):
            self.metrics.shed.inc(tags={"reason": "unavailable"})
            return OpenAIError(
                503,
                "No engine replica is available.",
                type="server_error",
                code="service_unavailable",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        if isinstance(e, StopAsyncIteration):
            return OpenAIError(500, "The engine closed the stream.", type="server_error")
        return e

    async def _items(self, stream: DeploymentResponseGenerator, first: dict[str, Any], call: _Call):
        """The engine's items, first one included, with TTFT and ITL recorded."""
        last_s = time.perf_counter()
        self.metrics.observe_ttft(call.lane, call.traffic_class, last_s - call.received_s)
        yield first
        if "finish" in first:
            return
        n = first["n"]
        async for item in stream:
            t = time.perf_counter()
            if item["n"] > n:
                self.metrics.observe_itl(call.lane, call.traffic_class, (t - last_s) / (item["n"] - n))
            last_s, n = t, item["n"]
            yield item
            if "finish" in item:
                return

    async def _collect(
        self, stream: DeploymentResponseGenerator, first: dict[str, Any], call: _Call, chat: bool
    ) -> JSONResponse:
        parts: list[str] = []
        last: dict[str, Any] = first
        async for item in self._items(stream, first, call):
            parts.append(item["text"])
            last = item
        text = "".join(parts)
        choice: dict[str, Any] = {"index": 0, "finish_reason": last.get("finish"), "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        body = {
            "id": call.rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": now_s(),
            "model": self.model_id,
            "choices": [choice],
            "usage": usage(call.prompt_tokens, last["n"], call.start.get("cached_tokens", 0)),
        }
        return JSONResponse(body, headers=call.headers())

    async def _sse(
        self,
        stream: DeploymentResponseGenerator,
        first: dict[str, Any],
        call: _Call,
        body: ChatCompletionRequest | CompletionRequest,
        chat: bool,
    ) -> AsyncIterator[str]:
        created = now_s()
        obj = "chat.completion.chunk" if chat else "text_completion"
        include_usage = body.include_usage

        def chunk(text: str | None, finish: str | None, role: bool = False) -> str:
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
            if chat:
                delta: dict[str, Any] = {"role": "assistant"} if role else {}
                if text is not None:
                    delta["content"] = text
                choice["delta"] = delta
            else:
                choice["text"] = text or ""
            data: dict[str, Any] = {"id": call.rid, "object": obj, "created": created, "model": self.model_id}
            data["choices"] = [choice]
            if include_usage:
                data["usage"] = None
            return sse(data)

        finished = False
        try:
            # One write per engine item: the SSE events of an item go out together.
            events = [chunk("", None, role=True)] if chat else []
            completion_tokens = 0
            async for item in self._items(stream, first, call):
                if item["text"]:
                    events.append(chunk(item["text"], None))
                completion_tokens = item["n"]
                if "finish" in item:
                    events.append(chunk(None if chat else "", item["finish"]))
                    if include_usage:
                        data = {"id": call.rid, "object": obj, "created": created, "model": self.model_id}
                        data["choices"] = []
                        data["usage"] = usage(call.prompt_tokens, completion_tokens, call.start.get("cached_tokens", 0))
                        events.append(sse(data))
                    events.append(sse("[DONE]"))
                    finished = True
                yield "".join(events)
                events = []
        finally:
            # On client disconnect Serve cancels this task; cancelling the engine call aborts the
            # request in the engine (queue slot and KV freed).
            if not finished:
                _cancel(stream)
            status = "200" if finished else "499"
            self.metrics.requests.inc(tags={"endpoint": "chat" if chat else "completions", "status": status})
