"""What our plain ASGI middlewares share: read a request header, answer with an OpenAI error.

Plain ASGI rather than Starlette's `BaseHTTPMiddleware`, so streamed responses pass through
untouched and a client disconnect still cancels the route's task.
"""

from __future__ import annotations

from starlette.types import Scope, Send

from serve_app.protocol.errors import OpenAIError


def header(scope: Scope, name: str) -> str | None:
    """The first value of request header `name` (case-insensitive), or None."""
    wanted = name.lower().encode()
    for key, value in scope.get("headers", ()):
        if key.lower() == wanted:
            return bytes(value).decode("latin-1")
    return None


async def send_error(send: Send, error: OpenAIError) -> None:
    """Answer the request with `error`'s status, headers and OpenAI body."""
    payload = error.encoded()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    headers += [(k.lower().encode(), v.encode("latin-1")) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
