"""The `sim` backend's settings (`args.sim`): which calibrated engine it simulates and how it answers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from scheduler.config import PolicyConfig
from serve_app.config.config_model import StrictConfig


class SimSettings(StrictConfig):
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

    def base_policy(self) -> tuple[PolicyConfig, int]:
        """The policy a `sim` replica starts from (`Engine.user_config.policy` goes on top): its rule set's policy
        and half-prefilled-request limit on its preset."""
        from scheduler.sim.presets import PRESETS
        from scheduler.sim.rules import RuleSet, policy_for

        return policy_for(RuleSet(self.rules), PRESETS[self.preset])
