"""`AppConfig`: the application's `args` in the config file (backend, model, engine start-up settings).

Fixed for the life of a deployment; `build_app` validates it before anything starts.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from scheduler.sglang_plugin.server_args import POLICY_FIELD_TO_SERVER_ARG
from serve_app.api.request_rules import default_max_body_bytes
from serve_app.config.config_model import StrictConfig
from serve_app.engines.sim.settings import SimSettings

Backend = Literal["sim", "sglang"]

SGLANG_ARGS_OWNED_BY_POLICY = {arg: field for field, arg in POLICY_FIELD_TO_SERVER_ARG.items()}
"""sglang arguments whose one switch is in the policy (the plugin writes them onto sglang's arguments)."""


def served_model_id(explicit: str | None, backend: str, sim_name: str, model_path: str) -> str:
    """The id clients send as `model`: the configured one, else the sim preset's, else the weights' folder name."""
    if explicit:
        return explicit
    if backend == "sim":
        return sim_name
    return model_path.rstrip("/").rsplit("/", 1)[-1]


class SglangSettings(StrictConfig):
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
        if "kv_events_config" in args:
            # sglang has one KV event publisher per engine; the replica reads it to publish what the engine holds.
            raise ValueError("kv_events_config: the replica sets it (a private endpoint it reads); remove it")
        return args


class EmbeddingsSettings(StrictConfig):
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


class AppConfig(StrictConfig):
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
    tenant_metric_labels: int = Field(
        100,
        ge=1,
        description="Distinct tenants a process names in its metrics' `tenant` label; later ones are counted as "
        "`other`, so a client inventing names cannot grow the series without bound.",
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
