"""The application builder named in `config.yaml` (`import_path: serve_app.app:build_app`).

`args` is validated as `AppConfig` before anything starts; a bad value stops `serve run` with a
message naming the field. Deployment sizes, limits and knobs come from the config file's
`deployments:` entries (one place); only what the app cannot work without is set here: the lane
router on the engine handle. With `args.embeddings` set, the `Embedder` deployment runs beside the engines.
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application, Deployment
from ray.serve.config import RequestRouterConfig

from serve_app.api.ingress import Ingress
from serve_app.config import AppConfig, validate
from serve_app.embeddings.embedder import Embedder
from serve_app.replica.engine_replica import Engine

ROUTER_CLASS = "serve_app.routing.lane_router:LaneRouter"


def build_app(args: dict[str, Any] | None = None) -> Application:
    cfg: AppConfig = validate(AppConfig, args or {}, "args")
    cfg_dict = cfg.model_dump()
    router = RequestRouterConfig.model_validate({"request_router_class": ROUTER_CLASS})
    engine = _deployment(Engine).options(request_router_config=router).bind(cfg_dict)
    embedder = _deployment(Embedder).bind(cfg_dict) if cfg.embeddings is not None else None
    return _deployment(Ingress).bind(engine, cfg_dict, embedder)


def _deployment(decorated: object) -> Deployment:
    """A class `@serve.deployment` turned into a `Deployment` (type checkers do not model class decorators)."""
    assert isinstance(decorated, Deployment)
    return decorated
