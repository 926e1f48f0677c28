"""The `Embedder` deployment: `/v1/embeddings` for the app's embeddings model, apart from the chat engines.

Its own replicas, limits and autoscaling (`deployments:` entry `Embedder` in the config file: Serve's
`max_ongoing_requests` / `max_queued_requests` shed a burst as 429s at the ingress, `autoscaling_config`
scales on ongoing requests). The ingress reaches it by model name. Each call returns the whole response
as `ResponseStart` + `ResponseBody` (the records the chat engines stream).

- `sim`: deterministic vectors (`serve_app.embeddings.sim_vectors`); concurrent requests are embedded together
  with `serve.batch` (dynamic batching, as the vector-search article's server does).
- `sglang`: `sglang.Engine(is_embedding=True)` answered by sglang's `OpenAIServingEmbedding`; concurrent
  requests and list inputs batch in sglang's own scheduler.
"""

from __future__ import annotations

import base64
import contextlib
import logging
from typing import Any, Protocol

import numpy as np
from pydantic import ValidationError
from ray import serve

from serve_app.api.request_log import configure_logging
from serve_app.api.request_rules import check_supported_fields, validation_error
from serve_app.config import AppConfig, EmbeddingsSettings, validate
from serve_app.embeddings.sim_vectors import sim_token_count, sim_vector
from serve_app.engines.sglang.engine_thread import EngineThread
from serve_app.engines.sglang.openai_serving import SglangOpenAI
from serve_app.protocol.errors import OpenAIError
from serve_app.protocol.openai_models import EmbeddingRequest
from serve_app.replica.backend import JSON, ResponseBody, ResponsePart, ResponseStart, error_response

logger = logging.getLogger(__name__)

EmbeddingResponse = list[ResponsePart]


class EmbeddingsBackend(Protocol):
    async def start(self) -> None: ...

    async def embed(self, body: dict[str, Any], rid: str) -> EmbeddingResponse: ...

    async def shutdown(self) -> None: ...


def _json_items(payload: dict[str, Any]) -> EmbeddingResponse:
    import json

    return [ResponseStart(200, JSON), ResponseBody(json.dumps(payload, separators=(",", ":")).encode())]


def _encoded(v: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(v.astype("<f4").tobytes()).decode()
    floats: list[float] = v.tolist()
    return floats


class SimEmbeddings:
    def __init__(self, settings: EmbeddingsSettings) -> None:
        self.settings = settings
        self.model_id = settings.served_model_id
        batched: Any = self._vectors  # `serve.batch`'s wrapper, whose setters its type leaves out
        batched.set_max_batch_size(settings.max_batch_size)
        batched.set_batch_wait_timeout_s(settings.batch_wait_timeout_s)

    async def start(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None

    async def embed(self, body: dict[str, Any], rid: str) -> EmbeddingResponse:
        try:
            check_supported_fields(body, EmbeddingRequest.model_fields, "embeddings on the sim backend")
            request = EmbeddingRequest.model_validate(body)
        except OpenAIError as e:
            return error_response(e)
        except ValidationError as e:
            return error_response(validation_error(e.errors()))
        dims = self.settings.dimensions
        if request.dimensions is not None and request.dimensions > dims:
            return error_response(
                OpenAIError(
                    400,
                    f"dimensions={request.dimensions} is larger than this model's {dims}.",
                    param="dimensions",
                )
            )
        vectors = await self._vectors((request.items, request.dimensions))
        data = [
            {"object": "embedding", "index": i, "embedding": _encoded(v, request.encoding_format)}
            for i, v in enumerate(vectors)
        ]
        tokens = sum(sim_token_count(x, self.settings.chars_per_token) for x in request.items)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return _json_items({"object": "list", "data": data, "model": self.model_id, "usage": usage})

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.002)
    async def _vectors(self, batch: list[tuple[list[Any], int | None]]) -> list[list[np.ndarray]]:
        """Concurrent requests' inputs embedded in one call (one batch per event-loop turn or `max_batch_size`)."""
        dims = self.settings.dimensions
        return [[sim_vector(item, dims, shortened) for item in items] for items, shortened in batch]


class SglangEmbeddings:
    def __init__(self, settings: EmbeddingsSettings) -> None:
        self.settings = settings
        self.model_id = settings.served_model_id
        self._loop: EngineThread | None = None
        self._engine: Any = None
        self._openai: SglangOpenAI | None = None

    def engine_kwargs(self) -> dict[str, Any]:
        return {"model_path": self.settings.model_path, "is_embedding": True, "log_level": "warning"} | dict(
            self.settings.engine_args
        )

    async def start(self) -> None:
        import sglang  # here: only this backend needs it, and importing it takes seconds

        kwargs = self.engine_kwargs()
        self._loop = EngineThread("sglang-embedding-loop")
        self._engine = await self._loop.build(lambda: sglang.Engine(**kwargs))
        self._openai = await self._loop.build(lambda: SglangOpenAI(self._engine))

    async def embed(self, body: dict[str, Any], rid: str) -> EmbeddingResponse:
        assert self._loop is not None and self._openai is not None, "embed before start"
        openai = self._openai
        return [item async for item in self._loop.stream(lambda: openai.respond("embeddings", body, rid))]

    async def shutdown(self) -> None:
        if self._engine is not None:
            import asyncio

            await asyncio.to_thread(self._engine.shutdown)
            self._engine = None
        if self._loop is not None:
            self._loop.stop()


def make_embeddings_backend(settings: EmbeddingsSettings) -> EmbeddingsBackend:
    return SimEmbeddings(settings) if settings.backend == "sim" else SglangEmbeddings(settings)


@serve.deployment(name="Embedder")
class Embedder:
    def __init__(self, app_config: dict[str, Any]) -> None:
        cfg: AppConfig = validate(AppConfig, app_config, "args")
        if cfg.embeddings is None:
            raise ValueError("args.embeddings is not set: the app has no embeddings model")
        self.backend = make_embeddings_backend(cfg.embeddings)
        self._started = False
        configure_logging()

    async def _ensure_started(self) -> None:
        if not self._started:
            await self.backend.start()
            self._started = True

    async def check_health(self) -> None:
        await self._ensure_started()

    async def embed(self, body: dict[str, Any], rid: str) -> EmbeddingResponse:
        await self._ensure_started()
        return await self.backend.embed(body, rid)

    async def __del__(self) -> None:
        with contextlib.suppress(Exception):
            await self.backend.shutdown()
