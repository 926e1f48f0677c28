"""The SLO autoscaling policy's knobs: the `policy_kwargs` of the Engine's `autoscaling_config.policy`.

Serve passes a plain function's `policy_kwargs` nowhere (it forwards them only to a policy class), so the policy
reads them from its context (`serve_app.autoscaling.serve_policy`) and validates them here, as
`serve_app.config.check` does for a config file before it is deployed. The rules they tune:
`serve_app.autoscaling.decision`; what each means for an operator: `docs/autoscaling.md`.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, model_validator

from serve_app.config.config_model import StrictConfig, validate

SLO_POLICY_FUNCTION = "serve_app.autoscaling.serve_policy:slo_autoscaling_policy"
"""The import path a config file names in `autoscaling_config.policy.policy_function`."""
KWARGS_WHERE = "Engine.autoscaling_config.policy.policy_kwargs"


class SloScalingKnobs(StrictConfig):
    """When the Engine deployment needs more replicas, or fewer, judged on what its replicas publish."""

    up_ttft_fraction: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Scale up when even the best replica's predicted TTFT of a new chat is above this fraction of "
        "its TTFT target: before the target is missed.",
    )
    down_ttft_fraction: float = Field(
        0.6,
        gt=0,
        lt=1,
        description="Scale down only while the second-best replica predicts a new chat's TTFT within this fraction "
        "of its target with its share of one replica's load more (the replica Serve removes may be the best one). "
        "Below `up_ttft_fraction`: the band between them is where nothing changes.",
    )
    backlog_horizon_s: float = Field(
        10.0,
        gt=0,
        description="Seconds of queued prefill one replica should clear: more queued than the replicas asked for can "
        "clear in this time scales up to as many as it takes.",
    )
    down_backlog_fraction: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="Scale down only while the queued prefill fits one replica fewer within this fraction of "
        "`backlog_horizon_s` each.",
    )
    down_occupancy_fraction: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="Scale down only while the requests in the engines fill at most this fraction of one replica "
        "fewer's running slots (`max_running_requests` each).",
    )
    attainment_floor: float = Field(
        0.9,
        ge=0,
        le=1,
        description="Scale up while the share of the replicas' latest chats that met the chat SLO (TTFT and TBT "
        "targets, judged as each response leaves its replica) is below this.",
    )

    @model_validator(mode="after")
    def _hysteresis(self) -> Self:
        if self.down_ttft_fraction >= self.up_ttft_fraction:
            raise ValueError(
                f"down_ttft_fraction={self.down_ttft_fraction} must be below up_ttft_fraction={self.up_ttft_fraction}: "
                "the band between them keeps the fleet from flapping"
            )
        return self


def slo_scaling_knobs(policy_kwargs: Any) -> SloScalingKnobs:
    """The policy's knobs from `policy_kwargs`; a `ConfigError` naming every bad one."""
    return validate(SloScalingKnobs, policy_kwargs, KWARGS_WHERE)
