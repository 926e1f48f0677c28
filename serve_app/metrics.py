"""The app's metrics, through Ray's metrics API (exported by Ray's Prometheus endpoint on each node).

Names start with `fairshare_`; Ray adds its `ray_` prefix on export. Series per tenant carry a `tenant` label of
bounded cardinality (`TenantLabels`, the one cap every such metric goes through).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Mapping

from ray.serve import metrics as serve_metrics
from ray.util import metrics as ray_metrics

from scheduler.slo import NOT_JUDGED, SloTargets, StreamLatency
from scheduler.tenants import DEFAULT_TENANT
from serve_app.protocol.sse import usage_in
from serve_app.replica.backend import EngineCounters, ReplicaLoad
from serve_app.routing.records import RouteDecision

LATENCY_BUCKETS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]
OTHER_TENANTS = "other"
"""The `tenant` label of every tenant past the cap."""
DEFAULT_TENANT_LABELS = 100


class TenantLabels:
    """The `tenant` label of a tenant: its name for the first `cap` distinct tenants this process sees, `other`
    for any later one. Tenant names come from clients (a header, `user`) where no key table names them: without a
    cap each new name would be a new series in every per-tenant metric, for as long as Prometheus keeps them."""

    def __init__(self, cap: int = DEFAULT_TENANT_LABELS) -> None:
        self.cap = cap
        self._named: set[str] = set()
        self._lock = threading.Lock()  # Serve calls a replica from its event loop and from threads of its own

    def __call__(self, tenant: str) -> str:
        if tenant in self._named:
            return tenant
        with self._lock:
            if len(self._named) < self.cap:
                self._named.add(tenant)
                return tenant
        return OTHER_TENANTS


class IngressMetrics:
    def __init__(self, tenant_labels: TenantLabels | None = None) -> None:
        self.tenant_label = tenant_labels or TenantLabels()
        self.ttft_s = ray_metrics.Histogram(
            "fairshare_ttft_seconds",
            description="Time to first token seen at the ingress, per lane and traffic class.",
            boundaries=LATENCY_BUCKETS_S,
            tag_keys=("lane", "traffic_class"),
        )
        self.itl_s = ray_metrics.Histogram(
            "fairshare_itl_seconds",
            description="Inter-token latency of streamed responses, per lane and traffic class.",
            boundaries=LATENCY_BUCKETS_S,
            tag_keys=("lane", "traffic_class"),
        )
        self.requests = ray_metrics.Counter(
            "fairshare_requests_total",
            description="Requests answered, by endpoint and HTTP status.",
            tag_keys=("endpoint", "status"),
        )
        self.shed = ray_metrics.Counter(
            "fairshare_shed_requests_total",
            description="Requests refused for overload (429, or 503 without a replica), by reason and tenant.",
            tag_keys=("reason", "tenant"),
        )
        self.replaced = ray_metrics.Counter(
            "fairshare_requests_replaced_total",
            description="Requests routed again because their engine replica was lost before any of their tokens "
            "reached the client (the client sees one normal response).",
        )
        self.tenant_tokens = ray_metrics.Counter(
            "fairshare_tenant_tokens_total",
            description="Tokens served by tenant, from the usage of each response the ingress relayed (a stream's "
            "when the client asked for it), by kind (prompt, completion).",
            tag_keys=("tenant", "kind"),
        )
        self.slo = ray_metrics.Counter(
            "fairshare_slo_requests_total",
            description="Requests whose tokens the ingress timed, judged when they ended normally against their "
            "class's targets on the replica that served them, by target (ttft, tbt, all: scheduler.slo.meets_slo) "
            "and outcome (within, over).",
            tag_keys=("lane", "traffic_class", "target", "outcome"),
        )

    def observe_ttft(self, lane: str, cls: str, seconds: float) -> None:
        self.ttft_s.observe(seconds, tags={"lane": lane, "traffic_class": cls})

    def observe_itl(self, lane: str, cls: str, seconds: float) -> None:
        self.itl_s.observe(seconds, tags={"lane": lane, "traffic_class": cls})

    def count_shed(self, reason: str, tenant: str) -> None:
        self.shed.inc(tags={"reason": reason, "tenant": self.tenant_label(tenant)})

    def count_replaced(self) -> None:
        self.replaced.inc()

    def count_served(self, tenant: str, prompt_tokens: int, completion_tokens: int) -> None:
        label = self.tenant_label(tenant)
        for kind, n in (("prompt", prompt_tokens), ("completion", completion_tokens)):
            if n > 0:
                self.tenant_tokens.inc(n, tags={"tenant": label, "kind": kind})


class StreamTimer:
    """TTFT and inter-token latency of one response as the ingress sees it (`scheduler.slo.StreamLatency`: one rule
    for every backend, and for the replicas' own judgement): each observation goes to the histograms. When the
    stream ends normally (`finish`), the request is judged against `slo`, its class's targets on the replica that
    served it (`scheduler.slo.meets_slo`), and counted within or over each."""

    def __init__(
        self, metrics: IngressMetrics, lane: str, traffic_class: str, received_s: float, slo: SloTargets = NOT_JUDGED
    ) -> None:
        self._metrics = metrics
        self._tags = (lane, traffic_class)
        self._latency = StreamLatency(received_s)
        self._slo = slo

    def tokens(self, n: int, at_s: float) -> None:
        """`n` tokens arrived at `at_s` (`time.perf_counter()`)."""
        first = self._latency.ttft_s is None
        observed = self._latency.tokens(n, at_s)
        if observed is None:
            return
        if first:
            self._metrics.observe_ttft(*self._tags, observed)
        else:
            self._metrics.observe_itl(*self._tags, observed)

    def finish(self) -> None:
        """The stream ended normally: count the request within or over its targets (none: not counted)."""
        slo = self._slo
        if slo.ttft_s is None and slo.tbt_s is None:
            return
        lane, cls = self._tags
        latency = self._latency
        verdicts = {"all": latency.meets(slo)}
        if slo.ttft_s is not None:
            verdicts["ttft"] = latency.meets(SloTargets(ttft_s=slo.ttft_s))
        if slo.tbt_s is not None:
            verdicts["tbt"] = latency.meets(SloTargets(tbt_s=slo.tbt_s))
        for target, within in verdicts.items():
            outcome = "within" if within else "over"
            self._metrics.slo.inc(tags={"lane": lane, "traffic_class": cls, "target": target, "outcome": outcome})


class ServedTokens:
    """One response's tokens served, counted once for its tenant when it ends, from the last `usage` its bytes
    carried (an engine may put one, the total so far, in every event of a stream). A stream whose client did not
    ask for usage carries none and counts nothing."""

    def __init__(self, metrics: IngressMetrics, tenant: str) -> None:
        self._metrics = metrics
        self._tenant = tenant
        self._usage: tuple[int, int] | None = None

    def seen(self, data: bytes) -> None:
        self._usage = usage_in(data) or self._usage

    def count(self) -> None:
        if self._usage is not None:
            self._metrics.count_served(self._tenant, *self._usage)
            self._usage = None


class RouterMetrics:
    def __init__(self) -> None:
        self.decisions = ray_metrics.Counter(
            "fairshare_routing_decisions_total",
            description="Routing decisions by lane, traffic class and reason (affinity, spill, gave-way, ...).",
            tag_keys=("lane", "traffic_class", "reason"),
        )

    def on_decision(self, d: RouteDecision) -> None:
        self.decisions.inc(
            tags={"lane": d.lane.value, "traffic_class": d.traffic_class.value, "reason": d.reason.value}
        )


class EngineMetrics:
    """One engine replica's gauges and counters, refreshed whenever it publishes its load (each routing-stats
    period). Serve's metric classes: each series carries the replica's `deployment`, `replica` and `application`."""

    def __init__(self, tenant_labels: TenantLabels | None = None) -> None:
        tags = ("lane",)
        self.tenant_label = tenant_labels or TenantLabels()
        self.ready = serve_metrics.Gauge(
            "fairshare_engine_ready", "1 when the replica's engine serves, 0 while it starts (loads its model).", tags
        )
        self.num_waiting = serve_metrics.Gauge("fairshare_engine_waiting_requests", "Not yet admitted.", tags)
        self.num_prefilling = serve_metrics.Gauge("fairshare_engine_prefilling_requests", "Admitted, prefilling.", tags)
        self.num_decoding = serve_metrics.Gauge("fairshare_engine_decoding_requests", "Decoding.", tags)
        self.prefill_tokens = serve_metrics.Gauge(
            "fairshare_engine_outstanding_prefill_tokens", "Uncached prompt tokens still to prefill.", tags
        )
        self.kv_used = serve_metrics.Gauge("fairshare_engine_kv_used_tokens", "KV tokens held by requests.", tags)
        self.skip_ahead = serve_metrics.Counter(
            "fairshare_engine_skip_ahead_total", "Requests admitted past a request rejected for KV capacity.", tags
        )
        self.aborted = serve_metrics.Counter(
            "fairshare_engine_aborted_total", "Requests aborted (client disconnect), queue and KV freed.", tags
        )
        self.sized_passes = serve_metrics.Counter(
            "fairshare_engine_passes_total", "Passes the policy sized from its latency targets.", tags
        )
        self.passes_over_target = serve_metrics.Counter(
            "fairshare_engine_passes_over_target_total",
            "Sized passes in which even the smallest pass the policy can plan is predicted over the target (ttft, "
            "tbt): the hardware cannot meet that target there.",
            ("lane", "target"),  # type: ignore[arg-type]  # Serve annotates its tag keys as a 1-tuple
        )
        self.tenant_queued = serve_metrics.Gauge(
            "fairshare_engine_tenant_queued_prefill_tokens",
            "Uncached prompt tokens still to prefill on the replica, by tenant.",
            ("lane", "tenant"),  # type: ignore[arg-type]
        )
        self._last = EngineCounters()
        self._queued_labels: set[str] = set()

    def publish(self, lane: str, load: ReplicaLoad, counters: EngineCounters) -> None:
        tags = {"lane": lane}
        self.ready.set(int(load.ready), tags=tags)
        self.num_waiting.set(load.num_waiting, tags=tags)
        self.num_prefilling.set(load.num_prefilling, tags=tags)
        self.num_decoding.set(load.num_decoding, tags=tags)
        self.prefill_tokens.set(load.prefill_tokens, tags=tags)
        self.kv_used.set(load.kv_used_tokens, tags=tags)
        last = self._last
        _advance(self.skip_ahead, counters.num_skip_ahead, last.num_skip_ahead, tags)
        _advance(self.aborted, counters.num_aborted, last.num_aborted, tags)
        _advance(self.sized_passes, counters.sized_passes, last.sized_passes, tags)
        for target, n in counters.passes_over_target.items():
            tagged = {**tags, "target": target}
            _advance(self.passes_over_target, n, last.passes_over_target.get(target, 0), tagged)
        self._last = dataclasses.replace(counters, passes_over_target=dict(counters.passes_over_target))

    def publish_tenants(self, lane: str, queued_tokens: Mapping[str, int]) -> None:
        """Each tenant's queued prefill tokens (tenant -> tokens; a tenant no longer queued goes back to 0). The
        default tenant's series is always there, 0 with nothing queued, so a replica's gauge exists from start."""
        by_label: Counter[str] = Counter()
        for tenant, tokens in queued_tokens.items():
            by_label[self.tenant_label(tenant)] += tokens
        by_label.setdefault(self.tenant_label(DEFAULT_TENANT), 0)
        for label in self._queued_labels | by_label.keys():
            self.tenant_queued.set(by_label[label], tags={"lane": lane, "tenant": label})
        self._queued_labels = {label for label, n in by_label.items() if n > 0}


def _advance(counter: ray_metrics.Counter, count: int, last: int, tags: dict[str, str]) -> None:
    """Carry a backend's monotonic `count` into `counter`, which last saw `last`. A count below `last` started
    again (an engine restarted with a new policy): all of it is new."""
    delta = count - last if count >= last else count
    if delta > 0:
        counter.inc(delta, tags=tags)
