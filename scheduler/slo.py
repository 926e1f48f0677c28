"""Service-level objectives: targets per traffic class, whether a request met them, attainment and goodput.

Pure arithmetic on what any client or engine records (no engine, no simulator), so every report judges by one
definition: the simulator's `compare` and `benchmarks/overload.py`, the Serve app's metrics, the load tests.

A request **meets its SLO** when it produced a first token within the class's TTFT target and the 99th
percentile of its gaps between tokens is within the TBT target; a target that is None is not judged, and a
request with no first token never meets a TTFT target. The percentile is the nearest rank, the ``ceil(0.99 n)``-th
smallest of its ``n`` gaps: a stream of fewer than 100 gaps must keep every gap within the target, and a longer
one may exceed it in at most 1% of its gaps. So one stall a reader sees in a short answer fails it, as it fails the
service-wide "TBT p99" target that the policy sizes passes for; a mean (DistServe's TPOT) would hide it.

**Attainment** is the share of a class's requests that met the SLO; **goodput** (DistServe) is how many met it per
second of the run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scheduler.traffic import TrafficClass

GAP_QUANTILE = 0.99


@dataclass(frozen=True, slots=True)
class SloTargets:
    """One traffic class's targets in seconds; None = not judged."""

    ttft_s: float | None = None
    tbt_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tbt_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name}={value!r}: an SLO target must be a positive number of seconds")


NOT_JUDGED = SloTargets()


def targets_for(cls: TrafficClass, interactive: SloTargets) -> SloTargets:
    """A traffic class's targets: short requests (chats) are judged by the interactive ones; long documents are
    not judged on latency."""
    return interactive if cls is TrafficClass.SHORT else NOT_JUDGED


def gap_quantile_s(gaps_s: Sequence[float], quantile: float = GAP_QUANTILE) -> float | None:
    """The nearest-rank quantile of a stream's gaps between tokens; None for a stream of fewer than two tokens."""
    if not gaps_s:
        return None
    ordered = sorted(gaps_s)
    return ordered[max(0, math.ceil(quantile * len(ordered)) - 1)]


def meets_slo(targets: SloTargets, ttft_s: float | None, gaps_s: Sequence[float]) -> bool:
    """Did one request meet its class's targets? `ttft_s`: None when it produced no token."""
    if targets.ttft_s is not None and (ttft_s is None or ttft_s > targets.ttft_s):
        return False
    if targets.tbt_s is not None:
        worst = gap_quantile_s(gaps_s)
        if worst is not None and worst > targets.tbt_s:
            return False
    return True


@dataclass(frozen=True, slots=True)
class Attainment:
    num_requests: int
    num_met: int
    span_s: float
    """The time the requests were served over (the run's length)."""

    @property
    def fraction(self) -> float | None:
        return self.num_met / self.num_requests if self.num_requests else None

    @property
    def goodput_per_s(self) -> float | None:
        """Requests that met the SLO per second (DistServe's goodput)."""
        return self.num_met / self.span_s if self.span_s > 0 else None


def attainment(met: Iterable[bool], span_s: float) -> Attainment:
    """Attainment and goodput of one class from each request's verdict (`meets_slo`)."""
    verdicts = list(met)
    return Attainment(num_requests=len(verdicts), num_met=sum(verdicts), span_s=span_s)


class StreamLatency:
    """One response's TTFT and gaps between tokens as one observer sees its bytes arrive, one rule for every
    observer (the ingress, a replica): the first arrival of tokens is the first token (from `started_s`); each
    later arrival of `n` tokens is one gap, its time since the previous arrival spread over its tokens (gap / n).
    Arrivals without tokens count nothing."""

    def __init__(self, started_s: float) -> None:
        self.started_s = started_s
        self.ttft_s: float | None = None
        self.gaps_s: list[float] = []
        self._last_s: float | None = None

    def tokens(self, n: int, at_s: float) -> float | None:
        """`n` tokens arrived at `at_s` (the clock of `started_s`): the TTFT or the gap this arrival observed, None
        when it carried none."""
        if n <= 0:
            return None
        if self._last_s is None:
            self.ttft_s = observed = at_s - self.started_s
        else:
            observed = (at_s - self._last_s) / n
            self.gaps_s.append(observed)
        self._last_s = at_s
        return observed

    def meets(self, targets: SloTargets) -> bool:
        return meets_slo(targets, self.ttft_s, self.gaps_s)
