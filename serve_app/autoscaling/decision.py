"""How many Engine replicas the load needs, from what the replicas publish: a pure function, `decide`.

Up, before the chats' TTFT target is missed; any one of:

- **chat TTFT**: even the best replica predicts a new chat's first token above `up_ttft_fraction` of its target;
- **backlog**: the queued prefill is more than the replicas asked for clear in `backlog_horizon_s` each;
- **attainment**: the share of the replicas' latest chats that met the chat SLO is below `attainment_floor`.

The backlog says how many replicas the work needs, and the fleet goes there at once; the other two say only that
more are needed: one more. Replicas asked for that have not published yet (starting, or loading their engine)
count as capacity coming: while any is, and for `settle_s` after (Serve's aggregates are means over that window,
still holding samples from before the new replicas took load), the TTFT and attainment rules wait. The backlog
counts them already (it is divided by every replica asked for), so it adds replicas then only when even those are
too few.

Down, one replica at a time and only with nothing starting or settling, when one replica fewer would still hold
the load with a margin: the queued prefill within `down_backlog_fraction` of its horizon, the requests within
`down_occupancy_fraction` of the slots, and a new chat predicted within `down_ttft_fraction` of the target on the
second-best replica (the one Serve removes may be the best) once it takes its share of the removed one's load. The
margins sit well below the up thresholds, so a
load between them changes nothing: no flapping.

Serve applies `min_replicas`/`max_replicas` and its `upscale_delay_s`/`downscale_delay_s` around the policy; the
decision keeps within the bounds itself too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from serve_app.autoscaling.signals import ReplicaSignals
from serve_app.config.autoscaling import SloScalingKnobs


class Reason(StrEnum):
    CHAT_TTFT = "chat-ttft"
    BACKLOG = "backlog"
    ATTAINMENT = "attainment"
    STARTING = "starting"
    """An up rule holds, but replicas asked for have not taken load yet: wait for them."""
    FITS_FEWER = "fits-fewer"
    STEADY = "steady"


@dataclass(frozen=True, slots=True)
class Fleet:
    """What one decision sees."""

    signals: Sequence[ReplicaSignals]
    """One entry per replica that has published."""
    target_replicas: int
    """The replicas Serve is asked for now, running or starting."""
    min_replicas: int
    max_replicas: int

    @property
    def starting(self) -> int:
        return max(0, self.target_replicas - len(self.signals))

    @property
    def queued_prefill_s(self) -> float:
        return sum(s.queued_prefill_s or 0.0 for s in self.signals)

    @property
    def requests(self) -> float:
        return sum(s.requests for s in self.signals)

    def ttft_ratios(self) -> list[float]:
        """Each replica's predicted chat TTFT over its target, best first (replicas without a prediction left out)."""
        return sorted(r for s in self.signals if (r := s.ttft_ratio) is not None)

    def attainment(self) -> float | None:
        measured = [s.chat_slo_attainment for s in self.signals if s.chat_slo_attainment is not None]
        return sum(measured) / len(measured) if measured else None

    def mean_slots(self) -> float:
        known = [s.engine_max_running_requests for s in self.signals if s.engine_max_running_requests > 0]
        return sum(known) / len(known) if known else 0.0


STATE_KEY = "slo_last_starting_s"


@dataclass(frozen=True, slots=True)
class ScalingState:
    """What the policy remembers between decisions (kept in Serve's `policy_state`)."""

    last_starting_s: float | None = None
    """The last time a replica asked for had not published."""

    def to_dict(self) -> dict[str, Any]:
        return {STATE_KEY: self.last_starting_s}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ScalingState:
        value = d.get(STATE_KEY)
        return cls(last_starting_s=float(value) if isinstance(value, int | float) else None)


@dataclass(frozen=True, slots=True)
class Decision:
    replicas: int
    reason: Reason
    state: ScalingState


def backlog_replicas(fleet: Fleet, knobs: SloScalingKnobs) -> int:
    """Replicas that clear the queued prefill within the horizon each."""
    return math.ceil(fleet.queued_prefill_s / knobs.backlog_horizon_s)


def chat_ttft_over(fleet: Fleet, knobs: SloScalingKnobs) -> bool:
    ratios = fleet.ttft_ratios()
    return bool(ratios) and ratios[0] > knobs.up_ttft_fraction


def attainment_low(fleet: Fleet, knobs: SloScalingKnobs) -> bool:
    attainment = fleet.attainment()
    return attainment is not None and attainment < knobs.attainment_floor


def up_reason(fleet: Fleet, knobs: SloScalingKnobs) -> Reason | None:
    """The first up rule that holds, if any."""
    if backlog_replicas(fleet, knobs) > fleet.target_replicas:
        return Reason.BACKLOG
    if chat_ttft_over(fleet, knobs):
        return Reason.CHAT_TTFT
    if attainment_low(fleet, knobs):
        return Reason.ATTAINMENT
    return None


def fits_fewer(fleet: Fleet, knobs: SloScalingKnobs) -> bool:
    """One replica fewer would hold the load with the down margins."""
    fewer = fleet.target_replicas - 1
    if fewer < max(1, fleet.min_replicas):
        return False
    if fleet.queued_prefill_s > knobs.down_backlog_fraction * fewer * knobs.backlog_horizon_s:
        return False
    if fleet.requests > knobs.down_occupancy_fraction * fewer * fleet.mean_slots():
        return False
    # The removed replica may be the best one, and its share of the load moves to the rest: the second-best
    # replica's prediction grown as if its queue grew by n/(n-1) (an over-estimate: the idle part does not grow).
    remaining = fleet.ttft_ratios()[1:]
    return not remaining or remaining[0] * fleet.target_replicas / fewer <= knobs.down_ttft_fraction


def decide(fleet: Fleet, knobs: SloScalingKnobs, state: ScalingState, now_s: float, settle_s: float) -> Decision:
    """The replica count the load needs (within the bounds), why, and the state for the next decision. `settle_s`:
    how long after the last replica started the aggregates still mix in samples from before (Serve's
    `look_back_period_s`)."""
    n = fleet.target_replicas
    if fleet.starting:
        state = ScalingState(last_starting_s=now_s)
    settling = state.last_starting_s is not None and now_s - state.last_starting_s < settle_s
    reason = up_reason(fleet, knobs)
    if reason is Reason.BACKLOG:
        return _bounded(fleet, backlog_replicas(fleet, knobs), reason, state)
    if reason is not None:
        return _bounded(fleet, n if settling else n + 1, Reason.STARTING if settling else reason, state)
    if not settling and fits_fewer(fleet, knobs):
        return _bounded(fleet, n - 1, Reason.FITS_FEWER, state)
    return _bounded(fleet, n, Reason.STEADY, state)


def _bounded(fleet: Fleet, replicas: int, reason: Reason, state: ScalingState) -> Decision:
    return Decision(max(fleet.min_replicas, min(fleet.max_replicas, replicas)), reason, state)
