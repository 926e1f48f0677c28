"""The sglang replica's engine: the arguments it starts `sglang.Engine` with, and the policy the plugin runs there.

One policy on both sides of the replica: the plugin inside sglang fills its `PolicyConfig` from the ``FAIRSHARE_*``
variables the replica exports and from sglang's own values (`scheduler.sglang_plugin.policy.plugin_policy`); the
replica predicts it with the same function, from the same variables and the arguments it starts sglang with
(`sglang_policy`), and routes and sheds by it. Values sglang computes only as it starts (its concurrency limit from
memory when unset, its chunk size by GPU when unset) keep the policy's defaults in the prediction; the plugin reports
the policy it runs in its scheduler's internal state, and `reported_policy` reads it back.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from scheduler.config import PolicyConfig
from scheduler.sglang_plugin.env import explicit_policy_env, policy_env
from scheduler.sglang_plugin.policy import policy_defaults, predicted_policy
from serve_app.config.app_config import SglangSettings
from serve_app.config.config_model import ConfigError, describe_validation_error

logger = logging.getLogger(__name__)

NAMED_ENGINE_ARGS = ("mem_fraction_static", "context_length", "chunked_prefill_size", "max_running_requests")
"""`SglangSettings` fields passed to sglang under their own names when set."""


def sglang_engine_kwargs(settings: SglangSettings, mixed_decode: bool | None = None) -> dict[str, Any]:
    """The ``sglang.Engine(**kwargs)`` a replica starts: the settings' named arguments where set, then `engine_args`
    as given. `mixed_decode`: the policy's switch, as sglang's ``enable_mixed_chunk`` (None: not passed; the plugin
    writes the policy's onto sglang's arguments either way)."""
    kwargs: dict[str, Any] = {"model_path": settings.model_path, "tp_size": settings.tp_size}
    if mixed_decode is not None:
        kwargs["enable_mixed_chunk"] = mixed_decode
    kwargs["log_level"] = "warning"
    for name in NAMED_ENGINE_ARGS:
        if getattr(settings, name) is not None:
            kwargs[name] = getattr(settings, name)
    kwargs.update(settings.engine_args)
    return kwargs


def sglang_policy(
    settings: SglangSettings, overrides: Mapping[str, Any], where: str = "Engine.user_config.policy"
) -> PolicyConfig:
    """The policy the plugin will run in an engine started from `settings` with `overrides` exported as its
    ``FAIRSHARE_*`` variables (the only ones it sees: the backend clears the rest and exports the environment's and
    the user_config's, `SglangBackend`), validated as the plugin parses them: a bad value is a `ConfigError` naming
    the field before anything starts."""
    unknown = sorted(set(overrides) - set(PolicyConfig.model_fields))
    if unknown:
        raise ConfigError(f"{where}: unknown PolicyConfig field(s) {unknown}")
    try:
        explicit = explicit_policy_env(policy_env(overrides))
        return predicted_policy(explicit, sglang_engine_kwargs(settings))
    except ValidationError as e:
        raise ConfigError(describe_validation_error(where, e)) from None


def environment_policy(where: str = "the replica's environment") -> dict[str, Any]:
    """The policy knobs this process's environment sets (its ``FAIRSHARE_*`` variables: a node's, `runtime_env`, a
    Kubernetes container's), parsed as the plugin parses them; a bad value is a `ConfigError` naming the variable.
    They apply below `Engine.user_config.policy`, as on the simulated engine."""
    try:
        return explicit_policy_env()
    except ValidationError as e:
        raise ConfigError(describe_validation_error(where, e)) from None


def reported_policy(states: Sequence[Mapping[str, Any] | None], predicted: PolicyConfig) -> PolicyConfig:
    """The policy the plugin reports it runs (``policy`` in its state, `SchedulerPolicy.describe`: the first
    scheduler's that has one; data-parallel ranks fill theirs alike), or `predicted` until one has reported
    (`predicted` itself when the report equals it). `states`: each scheduler's plugin state (``fairshare`` in
    sglang's internal state), None where it has none."""
    for state in states:
        values = state.get("policy") if isinstance(state, Mapping) else None
        if not isinstance(values, Mapping):
            continue
        try:
            policy = PolicyConfig(**{**policy_defaults(), **values})
        except (TypeError, ValidationError) as e:
            logger.warning(
                "the sglang plugin reported a policy this replica cannot read, it keeps its prediction: %s", e
            )
            return predicted
        return predicted if policy == predicted else policy
    return predicted


def reported_passes(states: Sequence[Mapping[str, Any] | None]) -> tuple[int, dict[str, int]]:
    """The passes the plugin sized and, by target, those over it (``sized_passes``, ``missed_passes`` in its state,
    `SchedulerPolicy.describe`), summed over the schedulers that report them."""
    sized, over = 0, dict[str, int]()
    for state in states:
        if not isinstance(state, Mapping):
            continue
        sized += int(state.get("sized_passes") or 0)
        for target, n in (state.get("missed_passes") or {}).items():
            over[target] = over.get(target, 0) + int(n)
    return sized, over
