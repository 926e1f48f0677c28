"""OpenAI's error, raised anywhere on the request path and answered with its body and status."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import Response


class OpenAIError(Exception):
    """An error answered with OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    @classmethod
    def of_status(cls, status: int, message: str) -> OpenAIError:
        """An error the engine reported with only a status: the type follows the status class."""
        kind = "server_error" if status >= 500 else "invalid_request_error"
        return cls(status, message, type=kind)

    @classmethod
    def retry_later(cls, status: int, message: str, retry_after_s: int, code: str | None = None) -> OpenAIError:
        """A refusal the client should retry (429: over a limit; 503: nothing to serve it now), with `Retry-After`
        and OpenAI's type and code for the status (`code` overrides it)."""
        limited = status == 429
        return cls(
            status,
            message,
            type="rate_limit_exceeded" if limited else "server_error",
            code=code or retry_code(status),
            headers={"Retry-After": str(retry_after_s)},
        )

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def encoded(self) -> bytes:
        """The error body's bytes: every error response and error event carries these."""
        # As Starlette's JSONResponse writes it, so every error's bytes are the same wherever it is answered.
        return json.dumps(self.body(), ensure_ascii=False, separators=(",", ":")).encode()

    def stream_end(self) -> bytes:
        """The end of a stream that has started and failed: this error as an SSE event, then `[DONE]`."""
        return b"data: " + self.encoded() + b"\n\ndata: [DONE]\n\n"

    def response(self) -> Response:
        return Response(self.encoded(), status_code=self.status, headers=self.headers, media_type="application/json")


def retry_code(status: int) -> str:
    """OpenAI's error code for a refusal to retry: over a limit (429), or nothing to serve the request now."""
    return "rate_limit_exceeded" if status == 429 else "service_unavailable"
