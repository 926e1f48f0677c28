"""The hand-off from a scheduler to the engine: what one pass computes."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.interleave import PassKind


@dataclass
class StepPlan:
    kind: PassKind
    prefill: dict[str, int] = field(default_factory=dict)
    """rid -> prefill tokens this pass (admits waiting requests it names)."""
    decode: list[str] = field(default_factory=list)
    """rids producing one decode token this pass."""
