"""A variant of this app as a peer front: its name, ``fairshare+FIELD=VALUE[+FIELD=VALUE...]``, sets those fields over
the config file's, each where it lives:

- a field of the engines' policy (`scheduler.config.PolicyConfig`, the Engine deployment's ``user_config.policy``);
- a field of the Engine deployment's `user_config` (`serve_app.config.knobs.EngineKnobs`: `long_lane_replicas`,
  static lanes, and the replicas' other knobs);
- a field of the Ingress deployment's `user_config` (`serve_app.config.knobs.RoutingKnobs`: `chat_spill` and the
  router's other bounds).

No field has two homes (`test_no_field_lives_in_two_places`). A VALUE is read as YAML (`null`, numbers, booleans).
Each variant is checked by the same models that check a deployed config, with the config file's values around it,
so a bad field or value is refused by name before anything starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from harness.local_serve import deployment
from scheduler.config import PolicyConfig
from serve_app.config.knobs import EngineKnobs, RoutingKnobs

SEP = "+"
"""Between the app's name and each ``FIELD=VALUE`` of a variant's front name."""
HOMES: dict[str, type[BaseModel]] = {"policy": PolicyConfig, "engine": EngineKnobs, "routing": RoutingKnobs}
"""Where a variant's field may live, by the `Variant` attribute that holds it (EngineKnobs' own `policy` aside)."""


@dataclass(frozen=True)
class Variant:
    """What a variant front sets over the config file: `policy` (PolicyConfig fields), `engine` (EngineKnobs
    fields, policy aside) and `routing` (RoutingKnobs fields)."""

    policy: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    routing: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.policy or self.engine or self.routing)

    def apply(self, cfg: dict[str, Any]) -> None:
        """Set the Engine and Ingress knobs in a loaded config (in place); the policy goes with the app's policy
        override, as the shipped front's does."""
        for name, fields in (("Engine", self.engine), ("Ingress", self.routing)):
            if fields:
                deployment(cfg, name).setdefault("user_config", {}).update(fields)

    def describe(self) -> str:
        """What it changes, in words: "its engines' policy `x` 1; its Engine deployment's `y` None"."""
        parts = [
            f"{where} " + ", ".join(f"`{k}` {v!r}" for k, v in fields.items())
            for where, fields in (
                ("its engines' policy", self.policy),
                ("its Engine deployment's", self.engine),
                ("its Ingress deployment's", self.routing),
            )
            if fields
        ]
        return "; ".join(parts)


def parse_variant(front: str, app: str, cfg: dict[str, Any], shipped_policy: Mapping[str, Any]) -> Variant:
    """The variant a front's name asks for (empty for a name with no ``+``); ValueError naming what is wrong.
    `cfg`: the config file the app runs (its Engine and Ingress `user_config` around the variant's knobs);
    `shipped_policy`: the policy its engines run as shipped (around the variant's policy fields)."""
    base, *pairs = front.split(SEP)
    if not pairs:
        return Variant()
    if base != app:
        raise ValueError(f"only {app} has fields to vary, not {base!r}")
    fields: dict[str, dict[str, Any]] = {home: {} for home in HOMES}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        home = next((h for h, model in HOMES.items() if key in model.model_fields and key != "policy"), None)
        if not eq or home is None:
            raise ValueError(f"{pair!r} is not FIELD=VALUE with a field of PolicyConfig, EngineKnobs or RoutingKnobs")
        fields[home][key] = yaml.safe_load(value)
    knobs = {"engine": deployment(cfg, "Engine"), "routing": deployment(cfg, "Ingress")}
    around = {
        "policy": dict(shipped_policy),
        **{h: {k: v for k, v in (d.get("user_config") or {}).items() if k != "policy"} for h, d in knobs.items()},
    }
    for home, model in HOMES.items():
        if fields[home]:
            _check(model, {**around[home], **fields[home]}, fields[home])
    return Variant(**fields)


def _check(model: type[BaseModel], values: dict[str, Any], changed: dict[str, Any]) -> None:
    try:
        model.model_validate(values)
    except ValidationError as e:
        raise ValueError(f"not a valid {model.__name__}: {e.errors()[0]['msg']} ({changed})") from None
