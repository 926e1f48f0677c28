"""The live knobs: each deployment's `user_config`, applied by `reconfigure()` without restarting replicas.

- `EngineKnobs`: the `Engine` deployment's (scheduler policy, lane sizes, the simulator's time scale).
- `RoutingKnobs`: the `Ingress` deployment's (traffic-class hysteresis, load bounds, spill, tenant limits); carried to
  the router with each request. The short/long threshold is not here: it is the engines'
  `PolicyConfig.short_request_tokens`, which replicas publish to routers.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, ValidationError, model_validator

from scheduler.config import PolicyConfig
from serve_app.config.app_config import AppConfig
from serve_app.config.config_model import ConfigError, StrictConfig, describe_validation_error
from serve_app.config.sglang_engine import sglang_policy


class EngineKnobs(StrictConfig):
    """The `Engine` deployment's `user_config`: applied live by `reconfigure()`."""

    long_lane_replicas: int | None = Field(
        None,
        ge=0,
        description="Static lanes: replicas of rank < this serve the long-document lane, the others the chat lane "
        "(0 = no long lane; >= num_replicas = no chat lane). None (default): lanes follow the load, every replica "
        "takes either class and the router places each request by predicted TTFT (`routing.lane_policy`). A lone "
        "replica serves both.",
    )
    time_scale: float = Field(
        1.0, ge=0, description="sim only: wall seconds per simulated second (1 = real time, 0 = zero cost)."
    )
    policy: dict[str, Any] = Field(
        default_factory=dict,
        description="Scheduler policy overrides: `scheduler.config.PolicyConfig` fields, on top of the rule "
        "set's settings (sim) or the plugin's (sglang). The one place for the traffic threshold "
        "(`short_request_tokens`, also the routers' lanes) and mixed decode (`mixed_decode`, sglang's "
        "`enable_mixed_chunk`).",
    )
    published_prefix_pages: int = Field(
        4096,
        ge=0,
        description="Most prefix pages (64 tokens each) a replica publishes to routers of what its engine's prefix "
        "cache holds (`routing.prefix_pages`): routers place a request where most of its prompt is cached. The most "
        "recently stored go first, each prefix whole from its start.",
    )
    stream_spacing_s: float = Field(
        0.05,
        ge=0,
        le=0.25,
        description="After a stream's first output, its items go on at least this far apart, each holding what the "
        "engine wrote since the last (`replica.pacing`): fewer items through the replica, the ingress and Serve's "
        "proxy. A token waits at most this long; keep it well under the chats' time-between-tokens target. 0: an "
        "item for every write.",
    )
    max_queued_requests: int | None = Field(
        None,
        ge=1,
        description="Backpressure: requests without a first token one replica holds before it answers 429. "
        "Default: the policy's prefill concurrency N (2 x max_running_requests).",
    )
    max_queued_prefill_tokens: int | None = Field(
        None,
        ge=1,
        description="Backpressure: uncached prompt tokens queued for prefill on one replica before it answers 429 "
        "(a replica with none queued takes any one request). Default: 60 s of prefill at the sim preset's rate, "
        "at least one context window (sglang: two windows).",
    )

    @model_validator(mode="after")
    def _policy_fields(self) -> Self:
        unknown = sorted(set(self.policy) - set(PolicyConfig.model_fields))
        if unknown:
            raise ValueError(
                f"policy: unknown PolicyConfig field(s) {unknown}; known: {sorted(PolicyConfig.model_fields)}"
            )
        return self


def policy_config(
    base: PolicyConfig, overrides: dict[str, Any], where: str = "Engine.user_config.policy"
) -> PolicyConfig:
    """`base` with `overrides` applied, validated by `PolicyConfig` itself (bounds, cross-field checks)."""
    try:
        return base.with_overrides(**overrides)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(where, e)) from None


def engine_policy(cfg: AppConfig, overrides: dict[str, Any], where: str = "Engine.user_config.policy") -> PolicyConfig:
    """The policy an engine replica of this app runs with these overrides, validated before it starts.

    sim: on top of the rule set's policy for its preset. sglang: the policy the plugin will run, by the plugin's own
    rules (`sglang_engine.sglang_policy`): the overrides (its ``FAIRSHARE_*`` variables), then what sglang's
    arguments set (chunk size, concurrency) where the overrides do not name it. What sglang computes only as it starts
    keeps the policy's default here until the plugin reports it (`sglang_engine.reported_policy`).
    """
    if cfg.backend == "sim":
        return policy_config(cfg.sim.base_policy()[0], overrides, where)
    return sglang_policy(cfg.sglang, overrides, where)


class RoutingKnobs(StrictConfig):
    """The `Ingress` deployment's `user_config`: routing policy, applied live."""

    class_hysteresis: float = Field(
        0.5,
        ge=0,
        lt=1,
        description="A session classed long stays long until its uncached prompt falls below "
        "short_request_tokens * (1 - this), so a session near the threshold does not bounce between lanes. "
        "The threshold itself is the engine's `PolicyConfig.short_request_tokens` (Engine.user_config.policy).",
    )
    busy_pending_requests: int = Field(
        4,
        ge=1,
        description="For a chat, a replica is busy when this many requests wait for their first token there.",
    )
    busy_prefill_tokens: int = Field(
        16384,
        ge=1,
        description="For a long document, a replica is busy when this many uncached prompt tokens wait there.",
    )
    chat_spill: bool = Field(True, description="Chats may go to the long lane when every chat replica is busy.")
    session_ttl_s: float = Field(3600.0, gt=0, description="A session's pin is forgotten after this long unused.")
    max_sessions: int = Field(100_000, ge=1, description="Most sessions the router remembers (LRU).")
    tenant_max_queued_prefill_tokens: int | None = Field(
        None,
        ge=1,
        description="Most uncached prompt tokens one tenant may have queued for prefill, counted by the router from "
        "what it sent; a request over it is answered 429 naming the tenant, so a flood is shed from the tenant that "
        "floods. A tenant with nothing queued takes any one request. The key table may set a tenant's own. None "
        "(default): no limit per tenant.",
    )
