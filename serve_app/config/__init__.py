"""Typed configuration of the Serve app, validated at start and on every live change.

Three objects, one per place they are set in `config.yaml`:

- `AppConfig` (`app_config`): the application's `args` (backend, model, engine start-up settings).
  Fixed for the life of a deployment; `build_app` validates it before anything starts.
- `EngineKnobs` (`knobs`): the `Engine` deployment's `user_config` (scheduler policy, lane sizes, the
  simulator's time scale). Applied live by `reconfigure()`; replicas are not restarted.
- `RoutingKnobs` (`knobs`): the `Ingress` deployment's `user_config` (traffic-class hysteresis, load
  bounds, spill). Applied live; carried to the router with each request.

Every model forbids unknown keys, so a typo fails loudly instead of vanishing (Serve's own schema
silently drops unknown deployment keys); `validate` reports every bad field by name (`config_model`).
This module is the one import for all of it.
"""

from __future__ import annotations

from serve_app.config.app_config import (
    SGLANG_ARGS_OWNED_BY_POLICY,
    AppConfig,
    Backend,
    EmbeddingsSettings,
    SglangSettings,
    served_model_id,
)
from serve_app.config.config_model import ConfigError, StrictConfig, describe_validation_error, validate
from serve_app.config.knobs import EngineKnobs, RoutingKnobs, engine_policy, policy_config
from serve_app.config.sglang_engine import (
    environment_policy,
    reported_passes,
    reported_policy,
    sglang_engine_kwargs,
)
from serve_app.engines.sim.settings import SimSettings

__all__ = [
    "SGLANG_ARGS_OWNED_BY_POLICY",
    "AppConfig",
    "Backend",
    "ConfigError",
    "EmbeddingsSettings",
    "EngineKnobs",
    "RoutingKnobs",
    "SglangSettings",
    "SimSettings",
    "StrictConfig",
    "describe_validation_error",
    "engine_policy",
    "environment_policy",
    "policy_config",
    "reported_passes",
    "reported_policy",
    "served_model_id",
    "sglang_engine_kwargs",
    "validate",
]
