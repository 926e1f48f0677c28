"""sglang's own OpenAI serving classes, driven inside an engine replica without sglang's HTTP server.

The client's request body (plus the request id routing gave it) is validated by sglang's request model
and handed to `OpenAIServingChat` / `OpenAIServingCompletion` / `OpenAIServingEmbedding.handle_request`;
whatever they answer (a response model, an SSE stream, an error with its status) goes back as
`ResponseStart` + `ResponseBody` items. So every field sglang implements (tools, `response_format`,
logprobs, `n`, `echo`, list prompts, ...) works, and none is re-implemented here. A field sglang's model
does not declare would be dropped silently by pydantic: it is a 400 naming the field instead.

An error sglang writes into a started stream (an abort: its status as the error's `code`) marks its body with
that status (`stream_error_status`), so the ingress counts the request with it.

A plain request's prompt is not tokenized again: sglang takes the token ids the ingress made with the model's
own tokenizer and template (`respond(prompt_ids=...)`, `given_ids`); any other request is tokenized by sglang.

A request's tenant reaches sglang's scheduler as its routing key: the request sglang's serving classes are handed
carries it in the ``x-smg-routing-key`` header, which they copy into the request (`extract_routing_key`) and sglang
on to its scheduler's ``Req.routing_key``, where the plugin reads it (`scheduler.sglang_plugin.tenant_keys`). A
request of the default tenant at the policy's weight carries none: what no key reads as.

sglang polls the Starlette `Request` it is given for a disconnect; ours is built from a scope whose
`receive` reports one once the caller has gone. Cancelling the stream also aborts the request's ids
(sglang suffixes `_<i>` to the id of each of `n` choices) so the scheduler frees their KV.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ValidationError

from scheduler.tenants import DEFAULT_TENANT, tenant_key
from serve_app.api.request_rules import check_supported_fields, validation_error
from serve_app.engines.sglang.given_ids import SCOPE_KEY, GivenPrompt, given_prompt, use_given_ids
from serve_app.protocol.errors import OpenAIError
from serve_app.replica.backend import JSON, SSE, ResponseBody, ResponsePart, ResponseStart, error_response

if TYPE_CHECKING:
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
    from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    SglangRequest = ChatCompletionRequest | CompletionRequest | EmbeddingRequest

OpenAIKind = Literal["chat", "completions", "embeddings"]
ROUTING_ONLY_FIELDS = frozenset({"rid"})
"""Fields routing sets on the request; a client may not set them (its own id would break abort)."""
ROUTING_KEY_HEADER = "x-smg-routing-key"
"""The header sglang's OpenAI serving classes take a request's routing key from (`OpenAIServingBase`)."""


def request_models() -> dict[OpenAIKind, type[SglangRequest]]:
    from sglang.srt.entrypoints.openai import protocol  # imported with the engine: sglang takes seconds to import

    return {
        "chat": protocol.ChatCompletionRequest,
        "completions": protocol.CompletionRequest,
        "embeddings": protocol.EmbeddingRequest,
    }


def serving_classes(engine: Engine) -> dict[OpenAIKind, OpenAIServingBase]:
    """sglang's serving objects for `engine`, as its HTTP server builds them."""
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
    from sglang.srt.entrypoints.openai.serving_embedding import OpenAIServingEmbedding

    tm, templates = tokenizer_manager(engine), engine.template_manager
    serving: dict[OpenAIKind, OpenAIServingBase] = {
        "chat": tm.serving_chat_class(tm, templates),
        "completions": OpenAIServingCompletion(tm, templates),
        "embeddings": OpenAIServingEmbedding(tm, templates),
    }
    for kind, one in serving.items():
        use_given_ids(kind, one)  # takes the ingress's ids for a plain prompt
    return serving


def tokenizer_manager(engine: Engine) -> TokenizerManager:
    tm: TokenizerManager | None = engine.tokenizer_manager
    assert tm is not None, "sglang's engine starts with its tokenizer manager"
    return tm


def check_fields(kind: OpenAIKind, body: dict[str, Any], model: type[BaseModel]) -> None:
    """400 naming every field sglang's request model does not declare (pydantic would drop it silently)."""
    check_supported_fields(body, set(model.model_fields) - ROUTING_ONLY_FIELDS, f"{kind} on the sglang backend")


def request_ids(kind: OpenAIKind, body: dict[str, Any], rid: str) -> str | list[str]:
    """sglang wants one id per input of a list embedding request (`<rid>_<i>`, as it names `n` choices)."""
    items = body.get("input")
    if kind == "embeddings" and isinstance(items, list) and items and not isinstance(items[0], int):
        return [f"{rid}_{i}" for i in range(len(items))]
    return rid


_ERROR_EVENT = b'data: {"error"'


def stream_error_status(event: bytes) -> int | None:
    """The status of an error event sglang wrote into a started stream (`create_streaming_error_response`:
    `{"error": {..., "code": <status>}}`); None for any other event."""
    if not event.startswith(_ERROR_EVENT):
        return None
    try:
        code = json.loads(event.removeprefix(b"data: "))["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return 500
    return code if isinstance(code, int) and 400 <= code < 600 else 500


def openai_error_of(status: int, body: bytes) -> OpenAIError:
    """sglang's error response (`{"object": "error", "message", "type", "param", "code"}`) in OpenAI's shape,
    with sglang's status, message, type and param."""
    try:
        data = json.loads(body)
    except ValueError:
        data = {}
    data = data.get("error", data) if isinstance(data, dict) else {}
    message = str(data.get("message") or "The engine refused the request.")
    kind = str(data.get("type") or ("server_error" if status >= 500 else "invalid_request_error"))
    return OpenAIError(status, message, type=kind, param=data.get("param"))


def routing_key(tenant: str, weight: float | None) -> str | None:
    """The routing key a request carries into sglang: its tenant key (`tenant_key`); none for the default tenant at
    the policy's weight, so single-tenant traffic reaches sglang as a plain client's does."""
    return None if tenant == DEFAULT_TENANT and weight is None else tenant_key(tenant, weight)


class DisconnectableRequest:
    """A Starlette `Request` for sglang's `handle_request`, whose disconnect poll answers what `disconnect()` set;
    it carries the ingress's prompt ids for a plain request (`given_ids`) and the request's routing key."""

    def __init__(self, path: str, given: GivenPrompt | None = None, key: str | None = None) -> None:
        from starlette.requests import Request

        self._gone = asyncio.Event()
        headers = [] if key is None else [(ROUTING_KEY_HEADER.encode(), key.encode("latin-1"))]
        scope: dict[str, Any] = {
            "type": "http",
            "method": "POST",
            "path": path,
            "headers": headers,
            "query_string": b"",
            SCOPE_KEY: given,
        }
        self.request = Request(scope, receive=self._receive)

    async def _receive(self) -> dict[str, Any]:
        await self._gone.wait()
        return {"type": "http.disconnect"}

    def disconnect(self) -> None:
        self._gone.set()


class SglangOpenAI:
    """The serving classes of one engine; `respond` must run on the engine's own loop (`EngineThread.stream`)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._models: dict[OpenAIKind, type[SglangRequest]] = {}
        self._serving: dict[OpenAIKind, OpenAIServingBase] = {}

    async def respond(
        self,
        kind: OpenAIKind,
        body: dict[str, Any],
        rid: str,
        *,
        prompt_ids: Sequence[int] | None = None,
        tenant: str = DEFAULT_TENANT,
        tenant_weight: float | None = None,
    ) -> AsyncIterator[ResponsePart]:
        """sglang's answer to `body`; `prompt_ids`: the prompt's token ids as the ingress made them, which sglang
        takes instead of tokenizing where the request is plain (`given_ids`); `tenant`, `tenant_weight`: whom it is
        billed to, and that tenant's weight (None: the engine policy's), for the scheduler (`routing_key`)."""
        if not self._serving:  # built on first use, on the engine's loop, as sglang's HTTP server does at start
            self._models, self._serving = request_models(), serving_classes(self._engine)
        model = self._models[kind]
        try:
            check_fields(kind, body, model)
            request = model.model_validate({**body, "rid": request_ids(kind, body, rid)})
        except OpenAIError as e:
            for item in error_response(e):
                yield item
            return
        except ValidationError as e:
            for item in error_response(validation_error(e.errors())):
                yield item
            return
        given = given_prompt(kind, body, request, prompt_ids)
        raw = DisconnectableRequest(f"/v1/{kind}", given, routing_key(tenant, tenant_weight))
        done = False
        try:
            result = await self._serving[kind].handle_request(request, raw.request)
            async for item in self._items(result):
                yield item
            done = True
        finally:
            if not done:
                raw.disconnect()
                self._abort(rid, max(getattr(request, "n", 1) or 1, len(getattr(request, "input", None) or ())))

    async def _items(self, result: object) -> AsyncIterator[ResponsePart]:
        from starlette.responses import Response, StreamingResponse

        if isinstance(result, StreamingResponse):
            yield ResponseStart(result.status_code, SSE)
            async for piece in result.body_iterator:
                event = piece.encode() if isinstance(piece, str) else bytes(piece)
                yield ResponseBody(event, stream_error_status(event))
        elif isinstance(result, Response):
            if result.status_code >= 400:
                for item in error_response(openai_error_of(result.status_code, bytes(result.body))):
                    yield item
            else:
                yield ResponseStart(result.status_code, JSON)
                yield ResponseBody(bytes(result.body))
        else:
            assert isinstance(result, BaseModel), f"sglang answered with {type(result).__name__}"
            yield ResponseStart(200, JSON)
            yield ResponseBody(result.model_dump_json(exclude_none=False).encode())

    def _abort(self, rid: str, n: int) -> None:
        tm = tokenizer_manager(self._engine)
        for one in (rid, *(f"{rid}_{i}" for i in range(n))):
            tm.abort_request(rid=one)
