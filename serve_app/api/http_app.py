"""The ingress's FastAPI app: the middlewares in front of every route and the handlers that answer what no
route did, each with OpenAI's error body.

Plain ASGI middlewares (outermost first): the request id (`request_log`), the optional API keys (`auth`: each
names the request's tenant), the body guard (`request_rules`: size, UTF-8, JSON). A request refused before a route
ran is still counted in `fairshare_requests_total` (the routes count their own).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve_app.api.auth import ApiKeyMiddleware, process_key_table
from serve_app.api.endpoints import CHAT, COMPLETIONS
from serve_app.api.request_log import RequestIdMiddleware
from serve_app.api.request_rules import RequestBodyGuard, validation_error
from serve_app.metrics import IngressMetrics
from serve_app.protocol.errors import OpenAIError

logger = logging.getLogger(__name__)

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
ENDPOINT_BY_PATH = {CHAT_PATH: CHAT.name, COMPLETIONS_PATH: COMPLETIONS.name, EMBEDDINGS_PATH: "embeddings"}

api = FastAPI(title="fairshare-serve", docs_url=None, redoc_url=None)
# Starlette runs the last added outermost: every answer, 401 and 413 included, carries a request id.
api.add_middleware(RequestBodyGuard, max_body_bytes=lambda: api.state.max_body_bytes)
api.add_middleware(ApiKeyMiddleware, keys=process_key_table)  # read in the replica, not where the app was built
api.add_middleware(RequestIdMiddleware)  # the replica's own HTTP server, behind HAProxy, echoes the id


@api.exception_handler(OpenAIError)
async def _openai_error(request: Request, exc: OpenAIError) -> Response:
    return exc.response()


def _counted(request: Request, response: Response) -> Response:
    """Count an error answered before a route ran (the routes count their own)."""
    endpoint = ENDPOINT_BY_PATH.get(request.url.path)
    metrics: IngressMetrics | None = getattr(request.app.state, "metrics", None)
    if endpoint is not None and metrics is not None:
        metrics.requests.inc(tags={"endpoint": endpoint, "status": str(response.status_code)})
    return response


@api.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    return _counted(request, validation_error(exc.errors()).response())


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return OpenAIError(exc.status_code, str(exc.detail), type=kind).response()


@api.exception_handler(Exception)
async def _internal_error(request: Request, exc: Exception) -> Response:
    logger.exception("unhandled error")
    return OpenAIError(500, "internal server error", type="server_error").response()
