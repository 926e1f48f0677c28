"""Request ids on every response and log line, and no prompt or completion text in logs by default.

Behind Serve's HTTP proxy the id already exists when a request reaches the ingress: the proxy
keeps a client's `X-Request-ID` (or generates one), puts it in the request's headers, echoes it
in the response's and propagates it to every deployment the request reaches (Serve's request
context). This module adds what the proxy does not:

- a client id must be sane (`REQUEST_ID_PATTERN`): it ends up in log lines and other systems'
  headers, so anything else is a 400 naming the header, not a log injection;
- served without Serve's proxy (tests, a plain ASGI server), `RequestIdMiddleware` generates the
  id and sets the response header itself (`set_response_header=True`);
- `RequestIdLogFilter` stamps `record.request_id` on every record of our loggers, from the
  middleware's context variable or, in an engine replica, from Serve's request context;
- `loggable_text` is the one place that decides whether request text may be logged
  (`FAIRSHARE_LOG_CONTENT=1`; off by default): otherwise only its size is.
"""

from __future__ import annotations

import contextvars
import logging
import os
import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.api.asgi import header, send_error
from serve_app.protocol.errors import OpenAIError

REQUEST_ID_HEADER = "X-Request-ID"
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
LOG_CONTENT_ENV = "FAIRSHARE_LOG_CONTENT"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
NO_REQUEST = "-"

current_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex}"


def parse_request_id(value: str | None) -> str | None:
    """A client's id if sane, None if absent; a 400 `OpenAIError` otherwise (the value is not echoed)."""
    if value is None:
        return None
    if not REQUEST_ID_PATTERN.fullmatch(value):
        raise OpenAIError(
            400,
            f"{REQUEST_ID_HEADER} must be 1 to 128 characters: letters, digits, '.', '_', ':' or '-', "
            f"starting with a letter or digit (got {len(value)} characters).",
            code="invalid_request_id",
            param=REQUEST_ID_HEADER,
        )
    return value


class RequestIdMiddleware:
    """Plain ASGI middleware: validate or generate the request id and bind it for logging."""

    def __init__(self, app: ASGIApp, set_response_header: bool = False) -> None:
        self.app = app
        self.set_response_header = set_response_header
        """False behind Serve's proxy, which already echoes the id in the response."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            request_id = parse_request_id(header(scope, REQUEST_ID_HEADER)) or new_request_id()
        except OpenAIError as e:
            await send_error(send, e)
            return

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start" and self.set_response_header:
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (REQUEST_ID_HEADER.lower().encode(), request_id.encode())]
            await send(message)

        token = current_request_id.set(request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            current_request_id.reset(token)


def request_id() -> str | None:
    """This request's id: bound by the middleware (ingress) or carried by Serve (engine replicas)."""
    bound = current_request_id.get()
    if bound is not None:
        return bound
    return _serve_request_id()


def _serve_request_id() -> str | None:
    try:
        from ray.serve.context import _get_serve_request_context
    except ImportError:  # not running under Ray Serve
        return None
    return _get_serve_request_context().request_id or None


class RequestIdLogFilter(logging.Filter):
    """Adds `record.request_id` (`-` outside a request); filters nothing out."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id() or NO_REQUEST
        return True


def configure_logging(logger_name: str = "serve_app", level: int = logging.INFO) -> logging.Logger:
    """Our loggers write one line per record with the request id (idempotent: safe in every replica)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, RequestIdLogFilter) for h in logger.handlers for f in h.filters):
        handler = logging.StreamHandler()
        handler.addFilter(RequestIdLogFilter())
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level)
    return logger


def log_content_enabled() -> bool:
    return os.environ.get(LOG_CONTENT_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def loggable_text(text: str) -> str:
    """What a log line may say about a prompt or completion: its size, or (opted in) the text."""
    if log_content_enabled():
        return repr(text)
    return f"<{len(text)} chars>"
