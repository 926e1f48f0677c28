"""Per-traffic-class metrics of a simulated run, SLO attainment and goodput included (`scheduler.slo`)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel

from scheduler.sim.request import SimRequest
from scheduler.sim.runner import RunResult
from scheduler.slo import NOT_JUDGED, SloTargets, attainment, meets_slo, targets_for
from scheduler.traffic import TrafficClass


class Percentiles(BaseModel):
    p50: float | None
    p99: float | None
    max: float | None
    mean: float | None

    @classmethod
    def of(cls, xs: Sequence[float]) -> Percentiles:
        if not xs:
            return cls(p50=None, p99=None, max=None, mean=None)
        a = np.asarray(xs)
        return cls(
            p50=float(np.percentile(a, 50)), p99=float(np.percentile(a, 99)), max=float(a.max()), mean=float(a.mean())
        )


class ClassMetrics(BaseModel):
    traffic_class: TrafficClass
    count: int
    ttft_s: Percentiles
    itl_s: Percentiles
    itl_during_long_prefill_s: Percentiles
    e2e_s: Percentiles
    decode_passes_stalled: int
    long_prefill_tok_per_s: float | None
    slo_attainment: float | None
    """Share of the class's requests that met its SLO targets (`scheduler.slo.meets_slo`)."""
    goodput_per_s: float | None
    """Requests that met the SLO per second of the run (DistServe's goodput)."""


class RunMetrics(BaseModel):
    policy: str
    preset: str
    classes: dict[str, ClassMetrics]
    decode_only_step_s: float
    """A decode-only pass of one row at short context: the ITL a stream gets with no prefill around."""
    slo: dict[str, tuple[float | None, float | None]]
    """class -> (TTFT target s, TBT target s) the attainment was judged by (None = not judged)."""


def long_prefill_windows(reqs: Sequence[SimRequest]) -> list[tuple[float, float]]:
    """Intervals in which a long request was admitted and still prefilling, merged."""
    spans = sorted(
        (r.admitted_s, r.first_token_s)
        for r in reqs
        if r.traffic_class is TrafficClass.LONG and r.admitted_s is not None and r.first_token_s is not None
    )
    merged: list[tuple[float, float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _overlaps(a: float, b: float, windows: Sequence[tuple[float, float]]) -> bool:
    return any(a < wb and b > wa for wa, wb in windows)


def class_metrics(
    cls: TrafficClass,
    reqs: Sequence[SimRequest],
    windows: Sequence[tuple[float, float]],
    targets: SloTargets,
    span_s: float,
) -> ClassMetrics:
    mine = [r for r in reqs if r.traffic_class is cls]
    itls, itls_during = [], []
    for r in mine:
        t = r.token_times_s
        for a, b in itertools.pairwise(t):
            itls.append(b - a)
            if _overlaps(a, b, windows):
                itls_during.append(b - a)
    throughput = None
    if cls is TrafficClass.LONG and windows:
        tokens = sum(r.prompt_tokens - r.cached_tokens for r in mine if r.first_token_s is not None)
        throughput = tokens / sum(b - a for a, b in windows)
    return ClassMetrics(
        traffic_class=cls,
        count=len(mine),
        ttft_s=Percentiles.of([r.ttft_s for r in mine if r.ttft_s is not None]),
        itl_s=Percentiles.of(itls),
        itl_during_long_prefill_s=Percentiles.of(itls_during),
        e2e_s=Percentiles.of([r.finish_s - r.arrival_s for r in mine if r.finish_s is not None]),
        decode_passes_stalled=sum(r.decode_passes_stalled for r in mine),
        long_prefill_tok_per_s=throughput,
        **_slo_fields(mine, targets, span_s),
    )


def _slo_fields(reqs: Sequence[SimRequest], targets: SloTargets, span_s: float) -> dict[str, float | None]:
    att = attainment((meets_slo(targets, r.ttft_s, r.itls_s()) for r in reqs), span_s)
    return {"slo_attainment": att.fraction, "goodput_per_s": att.goodput_per_s}


def default_slo(result: RunResult) -> dict[TrafficClass, SloTargets]:
    """The preset's interactive targets per class (`scheduler.slo.targets_for`: documents are not judged)."""
    return {c: targets_for(c, result.preset.interactive_slo) for c in TrafficClass}


def measure(result: RunResult, slo: dict[TrafficClass, SloTargets] | None = None) -> RunMetrics:
    """Metrics per class; attainment judged by `slo` (class -> targets; default: `default_slo`)."""
    slo = default_slo(result) if slo is None else slo
    windows = long_prefill_windows(result.requests)
    present = {r.traffic_class for r in result.requests}
    start = min((r.arrival_s for r in result.requests), default=0.0)
    span = result.end_s - start
    classes = {
        c.value: class_metrics(c, result.requests, windows, slo.get(c, NOT_JUDGED), span)
        for c in TrafficClass
        if c in present
    }
    return RunMetrics(
        policy=result.policy,
        preset=result.preset.name,
        classes=classes,
        decode_only_step_s=result.preset.decode_step_s,
        slo={c.value: (t.ttft_s, t.tbt_s) for c, t in slo.items()},
    )
