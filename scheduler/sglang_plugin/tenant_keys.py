"""Whom each sglang request is billed to: its tenant, read from its routing key (`scheduler.tenants`).

sglang 0.5.23 carries one free string per request from the client to the scheduler, the routing key
(``Req.routing_key``): its OpenAI endpoints take it from the ``x-smg-routing-key`` header, ``/generate`` from the
body's ``routing_key``. sglang itself only counts requests by it (its routing-key metrics) and, under
``--schedule-policy routing_key``, sorts by it. A request's tenant and weight travel there as `tenant_key` writes them
(``acme``, or ``acme*2``) and are read back with `parse_tenant_key`; a request without a key is the default tenant's,
and one without a weight weighs what the policy's ``tenant_weights`` give its tenant.

Where no request carries a key this costs a pass nothing it could measure: the queue's tenants are kept up to date as
requests join it (`QueueTenants`), and the decode charge is read only while two tenants or more are backlogged.
"""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING, NamedTuple

from sglang.srt.managers.schedule_policy import CacheAgnosticPolicy

from scheduler.sglang_plugin.queue_tail import QueueTail
from scheduler.tenants import DEFAULT_TENANT, parse_tenant_key

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler


def req_tenant(req: Req) -> tuple[str, float | None]:
    """The request's tenant and the weight it carries (None: its tenant's policy weight)."""
    return parse_tenant_key(req.routing_key)


def _tenant_of(key: str | None) -> str:
    return DEFAULT_TENANT if key is None else parse_tenant_key(key)[0]


def queue_in_arrival_order(sched: Scheduler) -> bool:
    """Does sglang keep its waiting queue in arrival order (FCFS without priorities)? Only then may an index of the
    queue read on from where it left off (`queue_tail`)."""
    return sched.policy.policy is CacheAgnosticPolicy.FCFS and not sched.enable_priority_scheduling


class QueueTenants:
    """The tenants with requests waiting or half-prefilled (`QueueSnapshot.tenants`). The waiting queue's distinct
    routing keys are kept as requests join it (`queue_tail`): a pass reads the keys of the requests that joined since
    the last, and parses a key only when it is new."""

    def __init__(self) -> None:
        self._tail = QueueTail()
        self._keys: set[str | None] = set()
        self._waiting: frozenset[str] = frozenset()

    def read(self, sched: Scheduler) -> frozenset[str]:
        """The tenants of the scheduler's waiting queue and of its half-prefilled request."""
        queue, chunked = sched.waiting_queue, sched.chunked_req
        restart, start = self._tail.read_from(queue, queue_in_arrival_order(sched))
        if restart:
            self._keys, self._waiting = set(), frozenset()
        if len(queue) > start:
            keys = {r.routing_key for r in islice(queue, start, None)}
            if not keys <= self._keys:
                self._keys |= keys
                self._waiting = frozenset(_tenant_of(k) for k in self._keys)
        if chunked is None:
            return self._waiting
        tenant = _tenant_of(chunked.routing_key)
        return self._waiting if tenant in self._waiting else self._waiting | {tenant}


class DecodedRow(NamedTuple):
    """A request that decoded a token in a pass, as `PassPlanner.charge_decode` reads it."""

    tenant: str
    tenant_weight: float | None
    extend_tokens: int = 0
    """Prompt tokens it still has to prefill: none."""


def decoded_rows(batch: ScheduleBatch) -> list[DecodedRow]:
    """The requests that decoded a token in `batch`: a decode batch's rows, a mixed batch's decoding rows (a
    speculative pass's extra accepted tokens are not counted)."""
    mode = batch.forward_mode
    if mode.is_decode():
        reqs = batch.reqs
    elif mode.is_mixed():
        reqs = batch.decoding_reqs or []
    else:
        return []
    return [DecodedRow(*req_tenant(r)) for r in reqs]
