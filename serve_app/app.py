"""The application builder named in `config.yaml` (`import_path: serve_app.app:build_app`).

`args` is validated as `AppConfig` before anything starts; a bad value stops `serve run` with a
message naming the field. Deployment defaults set here are overridden by the `deployments:`
entries of the config file.
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from serve_app.config import AppConfig, EngineKnobs, RoutingKnobs, validate
from serve_app.engine import Engine
from serve_app.ingress import Ingress

ROUTER_CLASS = "serve_app.router:LaneRouter"
ROUTING_STATS_PERIOD_S = 0.5


def build_app(args: dict[str, Any] | None = None) -> Application:
    cfg: AppConfig = validate(AppConfig, args or {}, "args")
    cfg_dict = cfg.model_dump()
    engine_actor: dict[str, Any] = {"num_cpus": 0.5}
    if cfg.backend == "sglang":
        engine_actor = {"num_cpus": 2, "num_gpus": cfg.sglang.tp_size}
    engine = Engine.options(
        num_replicas=2,
        max_ongoing_requests=64,
        max_queued_requests=256,
        ray_actor_options=engine_actor,
        user_config=EngineKnobs().model_dump(),
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTER_CLASS,
            request_routing_stats_period_s=ROUTING_STATS_PERIOD_S,
            request_routing_stats_timeout_s=5.0,
        ),
    ).bind(cfg_dict)
    return Ingress.options(
        num_replicas=1,
        max_ongoing_requests=1024,
        ray_actor_options={"num_cpus": 0.5},
        user_config=RoutingKnobs().model_dump(),
    ).bind(engine, cfg_dict)
