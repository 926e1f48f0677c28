"""The plugin's environment: its own switches, and which policy variables the operator set.

``FAIRSHARE_PLUGIN_ENABLED=0`` turns the plugin off (sglang runs unpatched); ``FAIRSHARE_PLUGIN_FORCE=1``
patches an sglang version other than the tested one; ``FAIRSHARE_PASS_TRACE=FILE`` appends one JSON line
per planned pass to FILE (`scheduler.pass_trace`); ``FAIRSHARE_PLUGIN_CLOCK=FILE`` records the plugin's own time per
pass there (`clock`). The policy knobs are `PolicyConfig`'s
``FAIRSHARE_<FIELD>`` variables, the same as in the simulator; a knob counts as *explicitly set* when
`PolicyConfig`'s own settings source reads it (same prefix, case and empty-value rules: an empty variable
is unset, ``none`` sets an optional knob to None), which decides whether a value sglang already has (its
concurrency limit, its chunk size) or the variable wins.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import TypeAdapter
from pydantic_settings import EnvSettingsSource

from scheduler.config import PolicyConfig

PLUGIN_ENABLED_VAR = "FAIRSHARE_PLUGIN_ENABLED"
PLUGIN_FORCE_VAR = "FAIRSHARE_PLUGIN_FORCE"
PASS_TRACE_VAR = "FAIRSHARE_PASS_TRACE"
PLUGIN_CLOCK_VAR = "FAIRSHARE_PLUGIN_CLOCK"


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    return TypeAdapter(bool).validate_strings(value.strip())


def plugin_enabled() -> bool:
    return _flag(PLUGIN_ENABLED_VAR, True)


def plugin_forced() -> bool:
    return _flag(PLUGIN_FORCE_VAR, False)


def pass_trace_path() -> Path | None:
    """Where to write the pass trace; None (unset or empty) writes nothing."""
    value = os.environ.get(PASS_TRACE_VAR, "").strip()
    return Path(value) if value else None


def plugin_clock_path() -> Path | None:
    """Where to record the plugin's own time per pass; None (unset or empty) records nothing."""
    value = os.environ.get(PLUGIN_CLOCK_VAR, "").strip()
    return Path(value) if value else None


def explicit_policy_env() -> dict[str, object]:
    """The policy variables the operator set, read by `PolicyConfig`'s own environment source and parsed."""
    raw = EnvSettingsSource(PolicyConfig)()
    return {f: TypeAdapter(PolicyConfig.model_fields[f].annotation).validate_python(v) for f, v in raw.items()}


def explicit_policy_fields() -> set[str]:
    """`PolicyConfig` fields whose ``FAIRSHARE_*`` variable is set (non-empty)."""
    return set(explicit_policy_env())


def explicit_policy_value(field: str) -> object | None:
    """The parsed value of one policy variable, or None when the operator did not set it."""
    return explicit_policy_env().get(field)
