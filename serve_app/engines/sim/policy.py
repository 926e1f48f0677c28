"""The policy a `sim` replica starts from: its rule set on its preset (`Engine.user_config.policy` goes on top)."""

from __future__ import annotations

from scheduler.config import PolicyConfig
from scheduler.sim.presets import PRESETS
from scheduler.sim.rules import RuleSet, policy_for
from serve_app.engines.sim.settings import SimSettings


def base_policy(sim: SimSettings) -> tuple[PolicyConfig, int]:
    """The rule set's policy and half-prefilled-request limit for the sim preset."""
    return policy_for(RuleSet(sim.rules), PRESETS[sim.preset])
