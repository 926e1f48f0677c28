"""Typed configuration of the Serve app, validated at start and on every live change.

Three objects, one per place they are set in `config.yaml`:

- `AppConfig`: the application's `args` (backend, model, engine start-up settings). Fixed for
  the life of a deployment; `build_app` validates it before anything starts.
- `EngineKnobs`: the `Engine` deployment's `user_config` (scheduler policy, lane sizes, the
  simulator's time scale). Applied live by `reconfigure()`; replicas are not restarted.
- `RoutingKnobs`: the `Ingress` deployment's `user_config` (traffic-class hysteresis, load bounds,
  spill). Applied live; carried to the router with each request. The short/long threshold is not
  here: it is the engines' `PolicyConfig.short_request_tokens`, which replicas publish to routers.

Every model forbids unknown keys, so a typo fails loudly instead of vanishing (Serve's own schema
silently drops unknown deployment keys).
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from scheduler.config import PolicyConfig
from scheduler.sglang_plugin.server_args import POLICY_FIELD_TO_SERVER_ARG
from serve_app.request_rules import default_max_body_bytes

Backend = Literal["sim", "sglang"]

SGLANG_ARGS_OWNED_BY_POLICY = {arg: field for field, arg in POLICY_FIELD_TO_SERVER_ARG.items()}
"""sglang arguments whose one switch is in the policy (the plugin writes them onto sglang's arguments)."""


class ConfigError(ValueError):
    """A config value is wrong; the message names the field and the value."""


def describe_validation_error(where: str, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(root)"
        value = e.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        parts.append(f"{where}.{loc}: {e['msg']}{shown}")
    return "; ".join(parts)


def validate(model: type[BaseModel], data: Any, where: str) -> Any:
    """`model.model_validate(data)`, with a `ConfigError` that names every bad field."""
    try:
        return model.model_validate(data or {})
    except ValidationError as e:
        raise ConfigError(describe_validation_error(where, e)) from None


def served_model_id(explicit: str | None, backend: str, sim_name: str, model_path: str) -> str:
    """The id clients send as `model`: the configured one, else the sim preset's, else the weights' folder name."""
    if explicit:
        return explicit
    if backend == "sim":
        return sim_name
    return model_path.rstrip("/").rsplit("/", 1)[-1]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SimSettings(_Strict):
    """The `sim` backend: the simulator's engine, in real time."""

    preset: str = Field(
        "h100-8b",
        description="Calibrated engine preset (`scheduler.sim.presets`): pass costs, KV pool and limits. `h100-8b` "
        "is a current GPU; `card12gb-27b` the source article's 12 GB card (`config.card12gb.yaml`).",
    )
    rules: Literal["fairshare", "article-patch", "baseline"] = Field(
        "fairshare",
        description="Rule set the simulated engine starts with: our policy (`fairshare`), the article's patch "
        "(`article-patch`) or upstream sglang (`baseline`). `Engine.user_config.policy` overrides its fields live.",
    )
    chars_per_token: float = Field(4.0, gt=0, description="Approximate tokenizer: characters per token.")
    natural_output_tokens: int = Field(
        128,
        ge=1,
        description="Length of a synthetic answer when `max_tokens` allows it (finish_reason `stop`); "
        "a smaller `max_tokens` cuts it (finish_reason `length`).",
    )

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, preset: str) -> str:
        from scheduler.sim.presets import PRESETS  # here: only the sim backend needs the simulator

        if preset not in PRESETS:
            raise ValueError(f"unknown preset; choose from {sorted(PRESETS)}")
        return preset

    @property
    def kv_pool_tokens(self) -> int:
        from scheduler.sim.presets import PRESETS

        return PRESETS[self.preset].cost.kv_pool_tokens


class SglangSettings(_Strict):
    """The `sglang` backend: `sglang.Engine` in the replica process, one GPU per replica."""

    model_path: str = Field("", description="Model weights directory or hub id (must be on local disk).")
    tp_size: int = Field(1, ge=1, description="Tensor parallel size; the replica must hold this many GPUs.")
    mem_fraction_static: float | None = Field(None, gt=0, lt=1, description="sglang's static memory fraction.")
    context_length: int | None = Field(None, ge=1, description="Override the model's context length.")
    chunked_prefill_size: int | None = Field(
        None, ge=1, description="sglang's chunk budget; also our `chunk_budget_tokens` unless the policy sets it."
    )
    max_running_requests: int | None = Field(None, ge=1, description="sglang's concurrency limit.")
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="Further `sglang.Engine(**kwargs)` arguments, passed through as is."
    )

    @field_validator("engine_args")
    @classmethod
    def _policy_switches_live_in_the_policy(cls, args: dict[str, Any]) -> dict[str, Any]:
        owned = sorted(set(args) & set(SGLANG_ARGS_OWNED_BY_POLICY))
        if owned:
            hint = ", ".join(f"{a} -> policy.{SGLANG_ARGS_OWNED_BY_POLICY[a]}" for a in owned)
            raise ValueError(f"set these in Engine.user_config.policy instead ({hint})")
        return args


class EmbeddingsSettings(_Strict):
    """`/v1/embeddings`: a separate `Embedder` deployment, reached through the same ingress by model name."""

    backend: Backend = Field("sim", description="`sim` (deterministic vectors) or `sglang` (`is_embedding=True`).")
    model_id: str | None = Field(
        None,
        description="Model id clients name. Default: `sim-embedding-<dimensions>` for sim, the model path's last "
        "component for sglang.",
    )
    dimensions: int = Field(256, ge=1, le=8192, description="sim only: length of the vectors it returns.")
    chars_per_token: float = Field(4.0, gt=0, description="sim only: approximate tokenizer for `usage`.")
    max_batch_size: int = Field(64, ge=1, description="sim only: concurrent requests embedded in one batch.")
    batch_wait_timeout_s: float = Field(0.002, ge=0, description="sim only: longest a request waits for a batch.")
    model_path: str = Field("", description="sglang only: the embedding model's directory (local disk).")
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="sglang only: further `sglang.Engine(**kwargs)` arguments."
    )

    @model_validator(mode="after")
    def _backend_settings(self) -> Self:
        if self.backend == "sglang" and not self.model_path:
            raise ValueError("embeddings backend 'sglang' needs embeddings.model_path")
        return self

    @property
    def served_model_id(self) -> str:
        return served_model_id(self.model_id, self.backend, f"sim-embedding-{self.dimensions}", self.model_path)


class AppConfig(_Strict):
    """The application's `args` in `config.yaml`."""

    backend: Backend = Field("sim", description="`sim` (no GPU; the simulator in real time) or `sglang` (GPU).")
    model_id: str | None = Field(
        None,
        description="Model id served in `/v1/models` and responses. Default: `sim-<preset>` for sim (an honest "
        "name: no model runs), the model path's last component for sglang.",
    )
    sim: SimSettings = Field(default_factory=SimSettings)
    sglang: SglangSettings = Field(default_factory=SglangSettings)
    max_context_tokens: int | None = Field(
        None,
        ge=2,
        description="Largest prompt + max_tokens accepted (400 above). Default: the sim preset's KV pool, or "
        "sglang's context_length (required then).",
    )
    embeddings: EmbeddingsSettings | None = Field(
        None, description="An embeddings model next to the chat model (the `Embedder` deployment); none if unset."
    )
    default_max_tokens: int = Field(256, ge=1, description="`max_tokens` when a request does not set it.")
    max_request_bytes: int | None = Field(
        None,
        ge=1024,
        description="Largest request body accepted (413 above). Default: 16 bytes per context-window token "
        "(any prompt the window takes fits), at least 1 MiB.",
    )

    @model_validator(mode="after")
    def _backend_settings(self) -> Self:
        if self.backend == "sglang":
            if not self.sglang.model_path:
                raise ValueError("backend 'sglang' needs sglang.model_path")
            if self.context_limit_tokens is None:
                raise ValueError("backend 'sglang' needs max_context_tokens or sglang.context_length")
        return self

    @model_validator(mode="after")
    def _distinct_model_ids(self) -> Self:
        if self.embeddings is not None and self.embeddings.served_model_id == self.served_model_id:
            raise ValueError("embeddings.model_id must differ from the chat model's id (requests route by model)")
        return self

    @property
    def served_model_id(self) -> str:
        return served_model_id(self.model_id, self.backend, f"sim-{self.sim.preset}", self.sglang.model_path)

    @property
    def request_bytes_limit(self) -> int:
        return self.max_request_bytes or default_max_body_bytes(self.context_limit_tokens)

    @property
    def context_limit_tokens(self) -> int | None:
        if self.max_context_tokens is not None:
            return self.max_context_tokens
        if self.backend == "sim":
            return self.sim.kv_pool_tokens
        return self.sglang.context_length


class EngineKnobs(_Strict):
    """The `Engine` deployment's `user_config`: applied live by `reconfigure()`."""

    long_lane_replicas: int | None = Field(
        None,
        ge=0,
        description="Static lanes: replicas of rank < this serve the long-document lane, the others the chat lane "
        "(0 = no long lane; >= num_replicas = no chat lane). None (default): lanes follow the load, every replica "
        "takes either class and the router places each request by predicted TTFT (`serve_app.routing`). A lone "
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
    session_cache_sessions: int = Field(
        4096, ge=0, description="sim only: sessions whose prefix the replica keeps cached (LRU, also bounded by KV)."
    )
    published_sessions: int = Field(
        256, ge=0, description="Most recently used sessions whose cached tokens each replica publishes to routers."
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

    sim: on top of the rule set's policy for its preset. sglang: on top of `PolicyConfig()` as the plugin
    builds it in the replica's environment (`FAIRSHARE_*`); the plugin then fills what sglang's own
    arguments set (chunk size, concurrency) unless the overrides name them.
    """
    if cfg.backend == "sim":
        from serve_app.sim.policy import base_policy  # here: only the sim backend needs the simulator

        return policy_config(base_policy(cfg.sim)[0], overrides, where)
    return policy_config(PolicyConfig(), overrides, where)


class RoutingKnobs(_Strict):
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
