"""How fairly tenants shared a simulated run (`scheduler.tenants`): tokens served, each tenant's share of the prefill
while it was backlogged beside others, Jain's index over those passes, the largest service gap between two
backlogged tenants, and TTFT p99 by tenant.

A tenant is backlogged from a request's arrival until its prefill ends (its first token), as long as any request of
its is. Over the passes in which two or more tenants are backlogged, each is entitled to its weighted max-min share
of the pass's prefill tokens: a tenant whose backlog ended in the pass needed no more than it got, the others
could have used any amount (`weighted_fill`). Jain's index is taken over what each received against what it was
entitled to (1: exactly its share; 1/n: one tenant took everything).
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel

from scheduler.sim.request import SimRequest
from scheduler.sim.runner import RunResult
from scheduler.tenants import weighted_fill


class TenantMetrics(BaseModel):
    weight: float
    tokens_served: int
    """Prompt tokens prefilled and output tokens generated."""
    share_while_backlogged: float | None
    """Its share of the prefill tokens of the passes in which it and another tenant were backlogged."""
    share_while_all_backlogged: float | None
    """Its share of the prefill tokens of the passes in which every tenant of the run was backlogged."""
    ttft_p99_s: float | None


class TenantReport(BaseModel):
    tenants: dict[str, TenantMetrics]
    jain_while_backlogged: float | None
    """Jain's index of received over entitled prefill tokens, over the passes with two or more tenants backlogged."""
    max_service_gap_tokens: float | None
    """The largest difference in prefill tokens received (each over its weight) between two tenants over an interval
    in which both were backlogged (VTC's fairness bound)."""


class Backlog:
    """When each tenant had a request waiting or prefilling: merged [arrival, first token) intervals."""

    def __init__(self, reqs: Sequence[SimRequest]) -> None:
        spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for r in sorted(reqs, key=lambda r: r.arrival_s):
            end = r.first_token_s if r.first_token_s is not None else float("inf")
            mine = spans[r.tenant]
            if mine and r.arrival_s <= mine[-1][1]:
                mine[-1] = (mine[-1][0], max(mine[-1][1], end))
            else:
                mine.append((r.arrival_s, end))
        self._starts = {t: [a for a, _ in s] for t, s in spans.items()}
        self._spans = dict(spans)

    def at(self, t_s: float) -> set[str]:
        """The tenants backlogged at `t_s` (a pass's start)."""
        out = set()
        for tenant, starts in self._starts.items():
            i = bisect.bisect_right(starts, t_s) - 1
            if i >= 0 and self._spans[tenant][i][1] > t_s:
                out.add(tenant)
        return out


def tenant_report(result: RunResult) -> TenantReport:
    reqs = result.requests
    tenant_of = {r.rid: r.tenant for r in reqs}
    weights = {r.tenant: r.tenant_weight or 1.0 for r in reqs}
    backlog = Backlog(reqs)
    passes = []  # (backlogged tenants, prefill tokens by tenant) of each pass
    entitled: dict[str, float] = defaultdict(float)
    for step in result.steps:
        got: dict[str, int] = defaultdict(int)
        for rid, n in step.prefill.items():
            got[tenant_of[rid]] += n
        backlogged = backlog.at(step.start_s)
        passes.append((backlogged, got))
        if len(backlogged) >= 2:
            for t, share in _entitled(backlogged, backlog.at(step.end_s), got, weights).items():
                entitled[t] += share
    received, offered = _served([(b, got) for b, got in passes if len(b) >= 2])
    with_others = _shares(received, offered)
    with_all = _shares(*_served([(b, got) for b, got in passes if len(weights) >= 2 and b == set(weights)]))
    tenants = {
        t: TenantMetrics(
            weight=weights[t],
            tokens_served=sum(r.num_prefilled + r.num_generated for r in reqs if r.tenant == t),
            share_while_backlogged=with_others.get(t),
            share_while_all_backlogged=with_all.get(t),
            ttft_p99_s=_p99([r.ttft_s for r in reqs if r.tenant == t and r.ttft_s is not None]),
        )
        for t in sorted(weights)
    }
    ratios = [received[t] / entitled[t] for t in entitled if entitled[t] > 0]
    return TenantReport(
        tenants=tenants,
        jain_while_backlogged=jain(ratios) if len(ratios) >= 2 else None,
        max_service_gap_tokens=max_service_gap(passes, weights),
    )


def _entitled(
    backlogged: set[str], still: set[str], got: dict[str, int], weights: dict[str, float]
) -> dict[str, float]:
    """Each backlogged tenant's weighted max-min share of the pass's tokens: one whose backlog ended in the pass
    (not in `still`) wanted what it got, the others any amount."""
    names = sorted(backlogged)
    total = sum(got.values())
    wants = [total if t in still else got.get(t, 0) for t in names]
    return dict(zip(names, weighted_fill(wants, [weights[t] for t in names], total), strict=True))


def _served(passes: Sequence[tuple[set[str], dict[str, int]]]) -> tuple[dict[str, float], dict[str, float]]:
    """Over `passes`, each backlogged tenant's prefill tokens, and the tokens of the passes it was backlogged in."""
    got: dict[str, float] = defaultdict(float)
    offered: dict[str, float] = defaultdict(float)
    for backlogged, tokens in passes:
        total = sum(tokens.values())
        for t in backlogged:
            got[t] += tokens.get(t, 0)
            offered[t] += total
    return got, offered


def _shares(got: dict[str, float], offered: dict[str, float]) -> dict[str, float]:
    """Each tenant's part of the prefill tokens of the passes in which it was backlogged (`_served`)."""
    return {t: got[t] / offered[t] for t in offered if offered[t]}


def jain(xs: Sequence[float]) -> float:
    """Jain's fairness index: (sum x)^2 / (n sum x^2); 1 when all are equal."""
    squares = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * squares) if squares else 1.0


def max_service_gap(passes: Sequence[tuple[set[str], dict[str, int]]], weights: dict[str, float]) -> float | None:
    """The largest |W_i/w_i - W_j/w_j| accumulated over a run of consecutive passes in which both i and j were
    backlogged, over every pair; None when no two tenants were ever backlogged together."""
    worst: float | None = None
    for i, j in itertools.combinations(sorted(weights), 2):
        low = high = gap = 0.0
        together = False
        for backlogged, got in passes:
            if i in backlogged and j in backlogged:
                together = True
                gap += got.get(i, 0) / weights[i] - got.get(j, 0) / weights[j]
                low, high = min(low, gap), max(high, gap)
                worst = max(worst or 0.0, high - low)
            else:
                low = high = gap = 0.0
        if together and worst is None:
            worst = 0.0
    return worst


def _p99(xs: Sequence[float]) -> float | None:
    return float(np.percentile(np.asarray(xs), 99)) if xs else None
