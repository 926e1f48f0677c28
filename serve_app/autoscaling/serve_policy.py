"""The Serve adapter: `slo_autoscaling_policy`, named in the Engine's `autoscaling_config.policy.policy_function`
as `serve_app.autoscaling.serve_policy:slo_autoscaling_policy`.

Serve's controller calls it every control-loop tick with the deployment's `AutoscalingContext`. It reads each
running replica's signals from `ctx.aggregated_metrics` (Serve's aggregate of what `Engine.record_autoscaling_stats`
returned over `look_back_period_s`), its knobs from `ctx.config.policy.policy_kwargs` (Serve hands a plain
function's kwargs nothing else) and its state from `ctx.policy_state`, and returns `decision.decide`'s count; Serve
then applies `min_replicas`/`max_replicas` and `upscale_delay_s`/`downscale_delay_s` to it.

Serve pickles this module by value into its controller: it holds functions only, and imports the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from serve_app.autoscaling.decision import Fleet, ScalingState, decide
from serve_app.autoscaling.signals import ATTAINMENT_WINDOW_S, ReplicaSignals
from serve_app.config.autoscaling import slo_scaling_knobs
from serve_app.config.config_model import ConfigError

if TYPE_CHECKING:
    from ray.serve.config import AutoscalingContext

logger = logging.getLogger("ray.serve")  # the controller's log, beside Serve's own scaling lines

CONFIG_ERROR_KEY = "slo_config_error"
REASON_KEY = "slo_reason"


def slo_autoscaling_policy(ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
    """The Engine replica count the service levels need now, and the policy's state."""
    state = dict(ctx.policy_state)
    config = ctx.config
    if config is None:  # Serve passes every autoscaled deployment's config: without one there is nothing to read
        return ctx.target_num_replicas, state
    try:
        knobs = slo_scaling_knobs(config.policy.policy_kwargs)
    except ConfigError as e:
        # An exception here would stop the controller's update of every application each tick: hold instead.
        if state.get(CONFIG_ERROR_KEY) != str(e):
            logger.error("SLO autoscaling holds %s at %d replicas: %s", ctx.deployment_id, ctx.target_num_replicas, e)
        return ctx.target_num_replicas, {**state, CONFIG_ERROR_KEY: str(e)}
    fleet = Fleet(
        signals=published(ctx.aggregated_metrics or {}, ctx.running_replicas),
        target_replicas=ctx.target_num_replicas,
        min_replicas=ctx.capacity_adjusted_min_replicas,
        max_replicas=ctx.capacity_adjusted_max_replicas,
    )
    now_s = ctx.current_time if ctx.current_time is not None else 0.0
    # Serve's aggregates mix in samples of the last look-back period, and a replica's attainment counts the verdicts
    # of its own window before that: both still hold the time before a new replica took load.
    settle_s = config.look_back_period_s + ATTAINMENT_WINDOW_S
    decision = decide(fleet, knobs, ScalingState.from_dict(state), now_s, settle_s)
    if decision.replicas != ctx.target_num_replicas and state.get(REASON_KEY) != decision.reason.value:
        logger.info(
            "SLO autoscaling wants %d replicas of %s (now %d): %s",
            decision.replicas,
            ctx.deployment_id,
            ctx.target_num_replicas,
            decision.reason.value,
        )
    state.pop(CONFIG_ERROR_KEY, None)
    return decision.replicas, {**state, **decision.state.to_dict(), REASON_KEY: decision.reason.value}


def published(aggregated: Mapping[str, Mapping[Any, float]], replicas: Iterable[Any]) -> list[ReplicaSignals]:
    """The signals of each running replica that has published them (Serve's aggregates are keyed by metric, then
    by replica)."""
    out = []
    for replica in replicas:
        signals = ReplicaSignals.from_metrics({key: by[replica] for key, by in aggregated.items() if replica in by})
        if signals is not None:
            out.append(signals)
    return out
