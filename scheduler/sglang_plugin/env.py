"""The plugin's environment: its own switches, and which policy variables the operator set.

``FAIRSHARE_PLUGIN_ENABLED=0`` turns the plugin off (sglang runs unpatched); ``FAIRSHARE_PLUGIN_FORCE=1``
patches an sglang version other than the tested one; ``FAIRSHARE_PASS_TRACE=FILE`` appends one JSON line
per planned pass to FILE (`scheduler.pass_trace`); ``FAIRSHARE_PLUGIN_CLOCK=FILE`` records the plugin's own time per
pass there (`clock`). The policy knobs are `PolicyConfig`'s
``FAIRSHARE_<FIELD>`` variables, the same as in the simulator; a knob counts as *explicitly set* when
`PolicyConfig`'s own settings source reads it (same prefix, case and empty-value rules: an empty variable
is unset, ``none`` sets an optional knob to None), which decides whether a value sglang already has (its
concurrency limit, its chunk size) or the variable wins. A launcher exports its policy overrides with `policy_env`
and reads them back as the plugin will with `explicit_policy_env(environ)`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails
from pydantic_settings import EnvSettingsSource
from pydantic_settings.sources.utils import parse_env_vars

from scheduler.config import PolicyConfig, env_value, env_var_name

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


class _PolicyEnvSource(EnvSettingsSource):
    """`PolicyConfig`'s own environment source (its prefix, case and empty-value rules) over a given mapping."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(PolicyConfig)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


def policy_env(overrides: Mapping[str, object]) -> dict[str, str]:
    """The ``FAIRSHARE_*`` variables that set these policy fields, as a launcher exports them for the plugin
    (``none`` for None)."""
    return {env_var_name(f): env_value(v) for f, v in overrides.items()}


def explicit_policy_env(environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """The policy variables the operator set (in `environ`, default this process's environment), read by
    `PolicyConfig`'s own environment source and parsed."""
    raw = _PolicyEnvSource(os.environ if environ is None else environ)()
    values: dict[str, object] = {}
    errors: list[InitErrorDetails] = []
    for field, value in raw.items():
        try:
            values[field] = TypeAdapter(PolicyConfig.model_fields[field].annotation).validate_python(value)
        except ValidationError as e:  # named by the field, as `PolicyConfig`'s own errors are
            errors += [_located(field, err) for err in e.errors()]
    if errors:
        raise ValidationError.from_exception_data(PolicyConfig.__name__, errors)
    return values


def _located(field: str, err: ErrorDetails) -> InitErrorDetails:
    details = InitErrorDetails(type=err["type"], loc=(field, *err["loc"]), input=err["input"])
    if "ctx" in err:
        details["ctx"] = err["ctx"]
    return details


def explicit_policy_fields() -> set[str]:
    """`PolicyConfig` fields whose ``FAIRSHARE_*`` variable is set (non-empty)."""
    return set(explicit_policy_env())


def explicit_policy_value(field: str) -> object | None:
    """The parsed value of one policy variable, or None when the operator did not set it."""
    return explicit_policy_env().get(field)
