"""The plugin's environment: its own two switches, and which policy variables the operator set.

``FAIRSHARE_PLUGIN_ENABLED=0`` turns the plugin off (sglang runs unpatched); ``FAIRSHARE_PLUGIN_FORCE=1``
patches an sglang version other than the tested one. The policy knobs are `PolicyConfig`'s
``FAIRSHARE_<FIELD>`` variables, the same as in the simulator; a knob counts as *explicitly set* when its
variable is present, which decides whether a value sglang already has (its concurrency limit, its chunk
size) or the variable wins.
"""

from __future__ import annotations

import os

from pydantic import TypeAdapter

from scheduler.config import PolicyConfig, env_var_name

PLUGIN_ENABLED_VAR = "FAIRSHARE_PLUGIN_ENABLED"
PLUGIN_FORCE_VAR = "FAIRSHARE_PLUGIN_FORCE"


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    return TypeAdapter(bool).validate_strings(value.strip())


def plugin_enabled() -> bool:
    return _flag(PLUGIN_ENABLED_VAR, True)


def plugin_forced() -> bool:
    return _flag(PLUGIN_FORCE_VAR, False)


def explicit_policy_fields() -> set[str]:
    """`PolicyConfig` fields whose ``FAIRSHARE_*`` variable is set (matched case-insensitively, as
    pydantic-settings reads them)."""
    present = {name.upper() for name in os.environ}
    return {f for f in PolicyConfig.model_fields if env_var_name(f) in present}


def explicit_policy_value(field: str) -> object | None:
    """The parsed value of one policy variable, or None when the operator did not set it."""
    if field not in explicit_policy_fields():
        return None
    raw = next(v for k, v in os.environ.items() if k.upper() == env_var_name(field))
    return TypeAdapter(PolicyConfig.model_fields[field].annotation).validate_strings(raw)
