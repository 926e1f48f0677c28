"""What every config object of the app shares: strict models (unknown keys refused, frozen) and one way to
report a bad value (`ConfigError` naming the field and the value it got)."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

Model = TypeVar("Model", bound=BaseModel)


class ConfigError(ValueError):
    """A config value is wrong; the message names the field and the value."""


class StrictConfig(BaseModel):
    """A config object: a typo is an error, not a key that silently vanishes (as Serve's own schema lets it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def describe_validation_error(where: str, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(root)"
        value = e.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        parts.append(f"{where}.{loc}: {e['msg']}{shown}")
    return "; ".join(parts)


def validate(model: type[Model], data: Any, where: str) -> Model:
    """`model.model_validate(data)`, with a `ConfigError` that names every bad field."""
    try:
        return model.model_validate(data or {})
    except ValidationError as e:
        raise ConfigError(describe_validation_error(where, e)) from None
