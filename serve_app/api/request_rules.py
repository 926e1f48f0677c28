"""Strict request rules, each answered with a 4xx and a message that says what is wrong.

Reusable pieces for the OpenAI request models and the ingress (see `docs/reliability.md` for
how they are wired):

- `STRICT_REQUEST` / `STRICT_PART`: model configs for the request models. Strict types: a string
  is never a boolean or a number (`"stream": "yes"` is a 400); an integer is still a number.
- `RequestBodyGuard`: plain ASGI middleware in front of the routes. Oversized body -> 413 (the
  limit is configurable), invalid UTF-8, malformed JSON (NaN and Infinity included), unpaired
  surrogate escapes, a body that is not a JSON object -> 400; the body is read once, bounded,
  and replayed to the route.
- `validation_error`: one 400 from pydantic's errors, naming each field and the *type* it got
  (never the value: it may be prompt text).
- `check_context_window`: prompt and `max_tokens` against the context window, sizes in the message.
- `parse_session_id`: the session id (header or `user` field), or a 400 naming which.
- `check_supported_fields`: a 400 naming every request field the backend would not act on (no field is
  accepted and silently ignored, on any backend).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.api.asgi import header, send_error
from serve_app.protocol.errors import OpenAIError

STRICT_REQUEST = ConfigDict(strict=True, extra="forbid")
"""A request's top level and messages: strict types; a field the model does not declare is a 400 naming it
(the backend would not act on it; `check_supported_fields` says so at the top level)."""
STRICT_PART = ConfigDict(strict=True, extra="forbid")
"""Small closed objects (`stream_options`, content parts): strict, unknown fields refused."""

SESSION_HEADER = "X-Session-ID"
SESSION_ID_MAX_CHARS = 256
"""As OpenAI's `user` field, which is also a session id here."""
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
BYTES_PER_TOKEN_BOUND = 16
"""A token is at most ~4 characters, a character at most 4 UTF-8 bytes: a body within the
context window is never above 16 bytes per token (plus the JSON around it)."""
MIN_BODY_BYTES = 1 << 20


def default_max_body_bytes(context_limit_tokens: int | None) -> int:
    """Large enough for any prompt the context window takes, and never under 1 MiB."""
    if context_limit_tokens is None:
        return 8 * MIN_BODY_BYTES
    return max(MIN_BODY_BYTES, BYTES_PER_TOKEN_BOUND * context_limit_tokens)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


# -- the body, before any route sees it ------------------------------------------------------
def check_json_body(raw: bytes) -> dict[str, Any]:
    """`raw` parsed: 400 unless it is a UTF-8 JSON object with no NaN, Infinity or unpaired surrogate escape."""
    if not raw.strip():
        raise bad_request("The request body is empty; send a JSON object.", code="invalid_json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"The request body is not valid UTF-8 (invalid byte at offset {e.start}).") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except ValueError as e:
        where = f" (line {e.lineno}, column {e.colno})" if isinstance(e, json.JSONDecodeError) else ""
        msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
        raise bad_request(f"The request body is not valid JSON: {msg}{where}.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request(f"The request body must be a JSON object, not {_json_type(data)}.", code="invalid_json")
    path = _unpaired_surrogate(data, ())
    if path is not None:
        raise bad_request(
            "The request body has an unpaired UTF-16 surrogate escape (e.g. \\ud800) in a string; "
            "it cannot be encoded as text.",
            param=".".join(map(str, path)) or None,
        )
    return data


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _unpaired_surrogate(value: Any, path: tuple[str | int, ...]) -> tuple[str | int, ...] | None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    items: Iterable[tuple[str | int, Any]]
    if isinstance(value, dict):
        for key in value:
            if _unpaired_surrogate(key, path) is not None:
                return path
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _unpaired_surrogate(item, (*path, key))
        if found is not None:
            return found
    return None


def too_large(limit_bytes: int) -> OpenAIError:
    return OpenAIError(
        413, f"The request body is larger than {limit_bytes} bytes, this server's limit.", code="request_too_large"
    )


PARSED_BODY = "fairshare.parsed_body"
"""Where the body guard leaves the body it parsed, in the request's ASGI scope: the routes read it there."""


BODY_BYTES = "fairshare.body_bytes"
"""And the size of that body, in bytes."""


def parsed_body(request: Request) -> dict[str, Any]:
    """The request's JSON object, as the body guard parsed and checked it (the body is parsed once)."""
    return cast(dict[str, Any], request.scope[PARSED_BODY])


def body_bytes(request: Request) -> int:
    """The size of the request's body, as the body guard read it."""
    return cast(int, request.scope[BODY_BYTES])


class RequestBodyGuard:
    """Plain ASGI middleware: check a request's body once, bounded, then replay it to the route.

    After the replayed body, `receive` is the client's again, so a disconnect still reaches the
    route (and cancels its engine call).
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int | Callable[[], int]) -> None:
        self.app = app
        self._max_body_bytes = max_body_bytes
        """A number, or where to read it when the app's config arrives after the middleware is built."""

    @property
    def max_body_bytes(self) -> int:
        limit = self._max_body_bytes
        return limit() if callable(limit) else limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        try:
            raw = await self._read(scope, receive)
            if raw is None:  # the client left before sending its body: nobody to answer
                return
            scope[PARSED_BODY], scope[BODY_BYTES] = check_json_body(raw), len(raw)
        except OpenAIError as e:
            await send_error(send, e)
            return
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes | None:
        limit = self.max_body_bytes
        declared = header(scope, "content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                raise bad_request("Content-Length must be a non-negative integer.", param="Content-Length")
            if int(declared) > limit:
                raise too_large(limit)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


# -- fields -------------------------------------------------------------------------------------
def validation_error(errors: Sequence[Mapping[str, Any]]) -> OpenAIError:
    """One 400 for pydantic's (or FastAPI's) errors: each field, what is wrong, the type it got."""
    parts = []
    for e in errors:
        loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        got = f" (got {_json_type(e['input'])})" if "input" in e and e.get("type") != "missing" else ""
        parts.append(f"{loc}: {e.get('msg', 'invalid value')}{got}")
    first = next(iter(errors), {})
    param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
    return bad_request("; ".join(parts) or "Invalid request.", param=param)


def check_context_window(prompt_tokens: int, max_tokens: int, limit_tokens: int | None, prompt_param: str) -> None:
    """400 with the sizes when the prompt, `max_tokens` or both do not fit the context window."""
    if max_tokens < 1:
        raise bad_request(f"max_tokens must be at least 1 (got {max_tokens}).", param="max_tokens")
    if limit_tokens is None:
        return
    if max_tokens >= limit_tokens:
        raise bad_request(
            f"max_tokens={max_tokens} does not fit this model's context window of {limit_tokens} tokens "
            "with any prompt.",
            param="max_tokens",
            code="context_length_exceeded",
        )
    if prompt_tokens + max_tokens > limit_tokens:
        raise bad_request(
            f"This model's maximum context length is {limit_tokens} tokens; the request has {prompt_tokens} "
            f"prompt tokens and max_tokens={max_tokens} ({prompt_tokens + max_tokens} in all).",
            param=prompt_param if prompt_tokens >= limit_tokens else "max_tokens",
            code="context_length_exceeded",
        )


def check_supported_fields(body: Mapping[str, Any], supported: Iterable[str], where: str) -> None:
    """400 naming every top-level field of `body` not in `supported` (`where`: e.g. "the sim backend's chat")."""
    unknown = sorted(set(body) - set(supported))
    if unknown:
        listed = ", ".join(repr(f) for f in unknown)
        raise bad_request(
            f"Unsupported field(s) {listed} for {where}; supported: {', '.join(sorted(supported))}.",
            param=unknown[0],
            code="unsupported_field",
        )


def parse_request(model: type[BaseModel], raw: Mapping[str, Any], where: str) -> Any:
    """`raw` as `model`: a 400 naming any field `model` does not declare, or each invalid field."""
    check_supported_fields(raw, model.model_fields, where)
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise validation_error(e.errors()) from None


def parse_session_id(value: str | None, param: str = SESSION_HEADER) -> str | None:
    """A session id (the header, or the `user` field) if usable, None if absent; a 400 naming `param` otherwise.
    It is echoed in the `X-Session-ID` response header, so it must be header-safe."""
    if value is None:
        return None
    if not value or len(value) > SESSION_ID_MAX_CHARS or not value.isprintable() or not value.isascii():
        raise bad_request(
            f"{param} must be 1 to {SESSION_ID_MAX_CHARS} printable ASCII characters: it is the session id "
            f"(got {len(value)} characters).",
            param=param,
            code="invalid_session_id",
        )
    return value
