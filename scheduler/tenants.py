"""Fair share between tenants: the Virtual Token Counter of Sheng et al., "Fairness in Serving Large Language
Models" (OSDI 2024), applied to the passes this policy plans.

A tenant is whoever a request is billed to (an API key's team, an agent pipeline). Requests that name none belong
to `DEFAULT_TENANT`; with a single tenant every rule here leaves the per-request policy exactly as it was.

Each tenant has a counter: the service it received, in VTC's token prices (a prompt token 1, an output token 2:
the paper's weights, which track what a token costs a GPU closely enough and are the same on every engine, where
the pass-cost model's prices differ by engine and drift while it is young), divided by its weight. Three rules use it:

- **Admission order.** The planner walks the waiting queue tenant by tenant, always taking the next request of the
  tenant whose counter, plus what the walk has already given it, is lowest (`walk_order`); within a tenant, queue
  order. So the next document to start is the one of the tenant served least, not the one that came first.
- **The pass's long tokens** are shared among tenants by weight (a weighted max-min fill, `tenant_fill`), then among
  each tenant's requests as before (F caps a request inside its tenant's share, not the tenant: a tenant with one
  document is not held to F beside a tenant with twenty). A tenant that needs less than its share leaves the rest
  to the others: nothing is wasted, and a lone tenant gets everything.
- **The lift.** A tenant that becomes backlogged (it had nothing waiting or prefilling) starts at the lowest counter
  among the tenants already backlogged, never below: an idle tenant banks no service (VTC's counter lift).

Counters of tenants that are not backlogged and at or below that floor are dropped (the lift would restore them),
so the state holds only the tenants that are backlogged or ahead of them.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from scheduler.fair_share import water_fill

DEFAULT_TENANT = "default"
"""The tenant of a request that names none."""
WEIGHT_MARK = "*"
"""Between a tenant's name and its weight in a tenant key (`tenant_key`); tenant names never hold it."""
PREFILL_TOKEN_PRICE = 1.0
DECODE_TOKEN_PRICE = 2.0
"""VTC's prices: an output token counts twice a prompt token."""


class TenantRequest(Protocol):
    @property
    def tenant(self) -> str: ...

    @property
    def tenant_weight(self) -> float | None: ...

    @property
    def extend_tokens(self) -> int: ...


def tenant_key(tenant: str, weight: float | None = None) -> str:
    """A request's tenant and weight as one string, for an engine field that carries a string to the scheduler
    (sglang: the request's `routing_key`): ``acme``, or ``acme*2`` with a weight other than 1."""
    return tenant if weight is None or weight == 1.0 else f"{tenant}{WEIGHT_MARK}{weight:g}"


def parse_tenant_key(key: str | None) -> tuple[str, float | None]:
    """`tenant_key` read back: (tenant, weight or None); no key, or an unreadable weight, is the default tenant's
    or the tenant's policy weight."""
    if not key:
        return DEFAULT_TENANT, None
    tenant, mark, weight = key.partition(WEIGHT_MARK)
    if not mark:
        return tenant, None
    try:
        value = float(weight)
    except ValueError:
        return tenant, None
    return tenant, value if value > 0 else None


def weight_of(request: TenantRequest, weights: Mapping[str, float]) -> float:
    """The request's own weight (the Serve app sends its key's), else the policy's for its tenant, else 1."""
    return request.tenant_weight or weights.get(request.tenant, 1.0)


@dataclass
class TenantCounters:
    """The virtual token counters of the tenants that are backlogged or ahead of them."""

    counters: dict[str, float] = field(default_factory=dict)
    backlogged: frozenset[str] = frozenset()

    def counter(self, tenant: str) -> float:
        return self.counters.get(tenant, self.floor())

    def floor(self) -> float:
        """The lowest counter among the backlogged tenants (0 with none)."""
        return min((self.counters.get(t, 0.0) for t in self.backlogged), default=0.0)

    def observe(self, backlogged: Iterable[str]) -> None:
        """The tenants with work waiting or prefilling at the start of a pass: the newly backlogged are lifted, and
        counters the lift would restore are dropped."""
        now = frozenset(backlogged)
        if now != self.backlogged:
            staying = now & self.backlogged
            floor = min((self.counters.get(t, 0.0) for t in staying), default=None)
            for tenant in now - self.backlogged:
                start = 0.0 if floor is None else floor
                self.counters[tenant] = max(self.counters.get(tenant, start), start)
            self.backlogged = now
        if not now:
            self.counters.clear()
            return
        if len(self.counters) > len(now):
            low = self.floor()
            for tenant in [t for t, c in self.counters.items() if t not in now and c <= low]:
                del self.counters[tenant]

    def charge(self, tenant: str, weight: float, prefill_tokens: int = 0, decode_tokens: int = 0) -> None:
        service = PREFILL_TOKEN_PRICE * prefill_tokens + DECODE_TOKEN_PRICE * decode_tokens
        if service:
            self.counters[tenant] = self.counter(tenant) + service / weight


R = TypeVar("R", bound="TenantRequest")


def distinct_tenants(requests: Iterable[TenantRequest]) -> frozenset[str]:
    """The tenants of `requests` (an engine's `QueueSnapshot.tenants`)."""
    return frozenset(r.tenant for r in requests)


def walk_order(waiting: Sequence[R], counters: TenantCounters, weight: Callable[[R], float]) -> Iterable[R]:
    """The waiting queue in VTC order: repeatedly the next request (queue order) of the tenant whose counter plus
    the prompt tokens the walk already put before it, over its weight, is lowest; ties go to the tenant that
    queued first. One tenant: the queue as it is.

    Lazy: a request's figures are read only once the walk has reached it and goes on past it, since an engine may
    compute them on the first read (the sglang plugin matches the request against its prefix cache) and admission
    stops long before the end of a long queue. Only the tenants of the whole queue are read up front."""
    queues: dict[str, deque[R]] = {}
    for r in waiting:
        queues.setdefault(r.tenant, deque()).append(r)
    if len(queues) <= 1:
        return waiting
    return _walk_by_level(queues, counters, weight)


def _walk_by_level(queues: dict[str, deque[R]], counters: TenantCounters, weight: Callable[[R], float]) -> Iterator[R]:
    heap = [(counters.counter(t), i, t) for i, t in enumerate(queues)]
    heapq.heapify(heap)
    while heap:
        level, i, tenant = heapq.heappop(heap)
        r = queues[tenant].popleft()
        yield r
        if queues[tenant]:
            heapq.heappush(heap, (level + PREFILL_TOKEN_PRICE * r.extend_tokens / weight(r), i, tenant))


def tenant_fill(
    wants: Sequence[int], demands: Sequence[int], tenants: Sequence[str], weights: Mapping[str, float], budget: int
) -> list[int]:
    """Shares of `budget` for requests wanting `wants` (capped at F) of `demands` (what each has left): among
    tenants by weight first (a weighted max-min fill of their demands), then, inside each tenant's share, max-min
    among its requests' wants (`water_fill`), what F leaves going to its requests in order. One tenant: `water_fill`
    of the wants, as without tenants."""
    names = list(dict.fromkeys(t for t, w in zip(tenants, wants, strict=True) if w > 0))
    if len(names) <= 1:
        return water_fill(wants, budget)
    mine = {name: [i for i, t in enumerate(tenants) if t == name and wants[i] > 0] for name in names}
    totals = [sum(demands[i] for i in mine[name]) for name in names]
    shares = [0] * len(wants)
    for name, share in zip(names, weighted_fill(totals, [weights[n] for n in names], budget), strict=True):
        idx = mine[name]
        own = water_fill([wants[i] for i in idx], share)
        left = share - sum(own)
        for k, i in enumerate(idx):
            take = min(demands[i] - own[k], left)
            own[k] += take
            left -= take
        for k, i in enumerate(idx):
            shares[i] = own[k]
    return shares


def weighted_fill(wants: Sequence[int], weights: Sequence[float], budget: int) -> list[int]:
    """Weighted max-min shares of `budget` (whole tokens): each gets `level * weight` up to its want, the level as
    high as the budget allows; tokens rounding leaves go to the largest remainders."""
    shares = [0] * len(wants)
    active = [i for i, w in enumerate(wants) if w > 0]
    left = budget
    while active and left > 0:
        total = sum(weights[i] for i in active)
        level = left / total
        done = [i for i in active if wants[i] - shares[i] <= level * weights[i]]
        if not done:
            exact = {i: level * weights[i] for i in active}
            for i in active:
                shares[i] += int(exact[i])
            spare = budget - sum(shares)
            for i in sorted(active, key=lambda i: exact[i] - int(exact[i]), reverse=True)[:spare]:
                shares[i] += 1
            break
        for i in done:
            left -= wants[i] - shares[i]
            shares[i] = wants[i]
        active = [i for i in active if i not in done]
    return shares
