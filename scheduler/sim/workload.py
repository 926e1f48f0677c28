"""Workloads: named scenarios and a file format (YAML or JSON) for request groups.

File format::

    name: my-mix
    duration_s: 120          # optional: no arrivals after this
    groups:
      - name: docs
        traffic_class: long  # long | short (metrics are reported per class)
        count: 4
        prompt_tokens: 100000          # or {dist: uniform, low: 20000, high: 120000}
        output_tokens: 256
        arrival_s: 0.0                 # first arrival; then every interval_s, or Poisson at rate_per_s
        interval_s: 10.0
        session: agent                 # optional session id ("{i}" is replaced by the index)
        tenant: pipeline               # optional: whom the group's requests are billed to (scheduler.tenants)
        weight: 2                      # optional: that tenant's weight (or in the top-level map below)
    tenants:                 # optional: weight by tenant (a tenant named nowhere weighs 1)
      pipeline: 2
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, model_validator

from scheduler.sim.presets import H100_8B, Preset
from scheduler.sim.request import SimRequest
from scheduler.tenants import DEFAULT_TENANT
from scheduler.traffic import TrafficClass


class TokenDist(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dist: Literal["uniform", "lognormal"] = "uniform"
    low: int = Field(1, ge=1)
    high: int = Field(1, ge=1)
    median: int | None = Field(None, ge=1, description="lognormal median")
    sigma: float = Field(0.5, gt=0)

    def sample(self, rng: random.Random) -> int:
        if self.dist == "uniform":
            return rng.randint(self.low, self.high)
        return max(self.low, min(self.high, round(rng.lognormvariate(0, self.sigma) * (self.median or self.low))))


class Group(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    traffic_class: TrafficClass = TrafficClass.SHORT
    count: int = Field(ge=1)
    prompt_tokens: int | TokenDist
    output_tokens: int | TokenDist = 64
    arrival_s: float = Field(0.0, ge=0)
    interval_s: float | None = Field(None, ge=0)
    rate_per_s: float | None = Field(None, gt=0)
    session: str | None = None
    tenant: str = DEFAULT_TENANT
    weight: float | None = Field(None, gt=0, description="The tenant's weight (also settable in `tenants`).")

    @model_validator(mode="after")
    def _one_arrival_rule(self) -> Group:
        if self.interval_s is not None and self.rate_per_s is not None:
            raise ValueError(f"group {self.name}: give interval_s or rate_per_s, not both")
        return self


class Workload(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    groups: list[Group] = Field(min_length=1)
    duration_s: float | None = Field(None, gt=0)
    seed: int = 0
    tenants: dict[str, PositiveFloat] = Field(default_factory=dict, description="Weight by tenant.")

    @model_validator(mode="after")
    def _one_weight_per_tenant(self) -> Workload:
        for g in self.groups:
            named = self.weights().get(g.tenant)
            if g.weight is not None and named is not None and g.weight != named:
                raise ValueError(f"group {g.name}: tenant {g.tenant!r} weighs {g.weight} here and {named} elsewhere")
        return self

    def weights(self) -> dict[str, float]:
        """Weight by tenant, from `tenants` and the groups' `weight` (validated to agree)."""
        named = dict(self.tenants)
        for g in self.groups:
            if g.weight is not None:
                named.setdefault(g.tenant, g.weight)
        return named

    def requests(self) -> list[SimRequest]:
        rng = random.Random(self.seed)
        weights = self.weights()
        out: list[SimRequest] = []
        for g in self.groups:
            t = g.arrival_s
            for i in range(g.count):
                if self.duration_s is not None and t > self.duration_s:
                    break
                out.append(
                    SimRequest(
                        rid=f"{g.name}-{i}",
                        prompt_tokens=_draw(g.prompt_tokens, rng),
                        output_tokens=_draw(g.output_tokens, rng),
                        arrival_s=t,
                        traffic_class=g.traffic_class,
                        session=g.session.replace("{i}", str(i)) if g.session else None,
                        tenant=g.tenant,
                        tenant_weight=weights.get(g.tenant),
                    )
                )
                if g.rate_per_s:
                    t += rng.expovariate(g.rate_per_s)
                else:
                    t += g.interval_s or 0.0
        out.sort(key=lambda r: r.arrival_s)
        return out

    def short_only(self) -> list[SimRequest]:
        """The same requests (same draws, ids and arrivals) with the long documents removed: the reference run
        of the added-wait metric."""
        return [r for r in self.requests() if r.traffic_class is not TrafficClass.LONG]


def _draw(v: int | TokenDist, rng: random.Random) -> int:
    return v if isinstance(v, int) else v.sample(rng)


def load_workload(path: Path) -> Workload:
    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    return Workload.model_validate(data)


DOC_OUTPUT_TOKENS = 256
QUESTION_TOKENS = 30
QUESTION_OUTPUT_TOKENS = 64


def _docs(name: str, prompt_tokens: int, count: int = 1, arrival_s: float = 0.0, session: str | None = None) -> Group:
    return Group(
        name=name,
        traffic_class=TrafficClass.LONG,
        count=count,
        prompt_tokens=prompt_tokens,
        output_tokens=DOC_OUTPUT_TOKENS,
        arrival_s=arrival_s,
        session=session,
    )


def _questions(count: int, arrival_s: float, interval_s: float | None = None, session: str | None = None) -> Group:
    return Group(
        name="question",
        count=count,
        prompt_tokens=QUESTION_TOKENS,
        output_tokens=QUESTION_OUTPUT_TOKENS,
        arrival_s=arrival_s,
        interval_s=interval_s,
        session=session,
    )


def doc_question(question_at_s: float = 40.0) -> Workload:
    """The article: a cold 130k-token document; a 30-token question arrives during its prefill."""
    return Workload(name="doc-question", groups=[_docs("doc", 130_000), _questions(1, question_at_s)])


def doc_4sessions() -> Workload:
    """The article with four sessions, consistent with its diagnostic line ``need=70945 rem_total=68534``:
    on a 262,144-token KV pool two documents (100,000 and 93,098 prompt tokens, 256 output tokens
    reserved each) leave 68,534 free, so the third (70,689 + 256 = 70,945) is rejected for capacity.
    The fourth session asks a 30-token question every 7.3 s from 100 s on, while the first two
    documents still prefill: under the pre-fix rules the first question then waits ~110 s for the
    third document to get memory (seed: 109.7 s). That arrival time is an assumption chosen for this
    consistency; the article does not state it."""
    return Workload(
        name="doc-4sessions",
        groups=[
            _docs("doc-a", 100_000, session="a"),
            _docs("doc-b", 93_098, session="b"),
            _docs("doc-c", 70_689, arrival_s=1.0, session="c"),
            _questions(12, arrival_s=100.0, interval_s=7.3, session="d"),
        ],
    )


def doc_4parallel() -> Workload:
    """Four 60,000-token documents at once (as many as the KV pool holds), no short traffic:
    long prefill throughput in company."""
    return Workload(name="doc-4parallel", groups=[_docs("doc", 60_000, count=4, session="s{i}")])


def doc_lone() -> Workload:
    """One 130k-token document and nothing else: lone prefill throughput."""
    return Workload(name="doc-lone", groups=[_docs("doc", 130_000)])


def chunk_steps() -> Workload:
    """The step-comparison article's step simulation; arrival times are step indices (the runner's step clock)."""
    return Workload(
        name="chunk-steps",
        groups=[
            Group(name="short", count=8, prompt_tokens=200, output_tokens=64),
            Group(
                name="long",
                traffic_class=TrafficClass.LONG,
                count=1,
                prompt_tokens=10_000,
                output_tokens=8,
                arrival_s=10,
            ),
            Group(name="late", count=2, prompt_tokens=200, output_tokens=16, arrival_s=12),
        ],
    )


def mixed_poisson(
    chat_rate_per_s: float = 1.0, doc_rate_per_s: float = 0.02, duration_s: float = 300.0, seed: int = 0
) -> Workload:
    """Chat questions and documents arriving at random."""
    return Workload(
        name="mixed-poisson",
        duration_s=duration_s,
        seed=seed,
        groups=[
            Group(
                name="chat",
                count=10_000,
                prompt_tokens=TokenDist(dist="lognormal", low=16, high=2048, median=200),
                output_tokens=TokenDist(dist="uniform", low=32, high=256),
                rate_per_s=chat_rate_per_s,
            ),
            Group(
                name="doc",
                traffic_class=TrafficClass.LONG,
                count=10_000,
                prompt_tokens=TokenDist(dist="uniform", low=20_000, high=120_000),
                output_tokens=DOC_OUTPUT_TOKENS,
                rate_per_s=doc_rate_per_s,
            ),
        ],
    )


def _chats(rate_per_s: float, arrival_s: float = 0.0) -> Group:
    return Group(
        name="chat",
        count=100_000,
        prompt_tokens=TokenDist(dist="lognormal", low=16, high=2048, median=200),
        output_tokens=TokenDist(dist="uniform", low=32, high=256),
        arrival_s=arrival_s,
        rate_per_s=rate_per_s,
    )


def _speed(preset: Preset) -> float:
    """How much faster than the h100-8b preset this card prefills: overload scenarios keep their shape (the
    same requests, the same load) on any preset by scaling arrival rates and durations by it."""
    return preset.cost.prefill_tok_per_s / H100_8B.cost.prefill_tok_per_s


def _chat_rate(preset: Preset, h100_rate_per_s: float) -> float:
    """Chats per second: the h100-8b rate scaled by prefill speed, and at most what keeps a quarter of the
    running slots busy decoding chats (a slower card's decode must not saturate its slots on chats alone)."""
    per_chat_s = MEAN_CHAT_OUTPUT_TOKENS * preset.interactive_pass_s()
    return min(h100_rate_per_s * _speed(preset), CHAT_SLOT_SHARE * preset.max_running_requests / per_chat_s)


CHAT_SLOT_SHARE = 0.25
MEAN_CHAT_OUTPUT_TOKENS = 144
MEAN_DOC_TOKENS = 70_000
MEAN_CHAT_PROMPT_TOKENS = 230  # the lognormal's mean (median 200, sigma 0.5), clipped to [16, 2048]


def kv_burst(preset: Preset) -> Workload:
    """Bursts of long documents whose total prompt exceeds the KV pool, chats arriving among them (the shape
    of sglang's upstream report): every 60 s (h100 time) a burst of documents holding 1.6 pools of KV."""
    speed = _speed(preset)
    per_burst = max(2, round(1.6 * preset.cost.kv_pool_tokens / 60_000))
    groups = [
        Group(
            name=f"burst{b}",
            traffic_class=TrafficClass.LONG,
            count=per_burst,
            prompt_tokens=TokenDist(dist="uniform", low=40_000, high=80_000),
            output_tokens=DOC_OUTPUT_TOKENS,
            arrival_s=b * 60.0 / speed,
        )
        for b in range(2)
    ]
    chats = _chats(_chat_rate(preset, 2.0), 0.5 / speed)
    return Workload(name="kv-burst", duration_s=120.0 / speed, groups=[*groups, chats])


def poisson_load(load: float) -> Callable[[Preset], Workload]:
    """Chats and documents arriving at random, their prefill work `load` of the card's prefill rate."""

    def make(preset: Preset) -> Workload:
        speed = _speed(preset)
        chat_rate = _chat_rate(preset, 1.0)
        doc_rate = (load * preset.cost.prefill_tok_per_s - chat_rate * MEAN_CHAT_PROMPT_TOKENS) / MEAN_DOC_TOKENS
        return Workload(
            name=f"poisson-{round(100 * load)}",
            duration_s=180.0 / speed,
            seed=1,
            groups=[
                _chats(chat_rate),
                Group(
                    name="doc",
                    traffic_class=TrafficClass.LONG,
                    count=100_000,
                    prompt_tokens=TokenDist(dist="uniform", low=20_000, high=120_000),
                    output_tokens=DOC_OUTPUT_TOKENS,
                    rate_per_s=doc_rate,
                ),
            ],
        )

    return make


def doc_flood(preset: Preset) -> Workload:
    """A flood of long documents (twice what the card can prefill, for 60 s of h100 time) under a steady
    chat stream: the queue of documents only grows."""
    speed = _speed(preset)
    doc_interval = MEAN_DOC_TOKENS / (2.0 * preset.cost.prefill_tok_per_s)
    return Workload(
        name="doc-flood",
        duration_s=60.0 / speed,
        groups=[
            Group(
                name="doc",
                traffic_class=TrafficClass.LONG,
                count=100_000,
                prompt_tokens=TokenDist(dist="uniform", low=40_000, high=100_000),
                output_tokens=DOC_OUTPUT_TOKENS,
                interval_s=doc_interval,
            ),
            _chats(_chat_rate(preset, 2.0), 0.25 / speed),
        ],
    )


TENANT_DOC_TOKENS = 8_000
"""A tenant scenario's document: long (above the class bound), small enough that shares are measured over many."""


def _tenant_docs(tenant: str, count: int, arrival_s: float = 0.0, weight: float | None = None) -> Group:
    group = _docs(f"{tenant}-doc", TENANT_DOC_TOKENS, count=count, arrival_s=arrival_s)
    return group.model_copy(update={"tenant": tenant, "weight": weight})


def _tenant_chats(tenant: str, rate_per_s: float, duration_s: float) -> Group:
    chats = _chats(rate_per_s).model_copy(update={"name": f"{tenant}-chat", "tenant": tenant})
    return chats.model_copy(update={"count": max(1, round(rate_per_s * duration_s))})


def tenant_flood(preset: Preset) -> Workload:
    """A pipeline floods 20 documents; at the same moment a team sends one, queued behind them; people chat."""
    span = 20 * TENANT_DOC_TOKENS / preset.cost.prefill_tok_per_s
    return Workload(
        name="tenant-flood",
        groups=[
            _tenant_docs("pipeline", 20),
            _tenant_docs("team", 1),
            _tenant_chats("people", _chat_rate(preset, 1.0), span),
        ],
    )


def tenant_weights(preset: Preset) -> Workload:
    """Three tenants weighted 1:2:4 flood documents at once, each more than the run serves while all wait."""
    return Workload(
        name="tenant-weights",
        groups=[_tenant_docs(t, 40, weight=w) for t, w in (("bronze", 1.0), ("silver", 2.0), ("gold", 4.0))],
    )


def tenant_late(preset: Preset) -> Workload:
    """A tenant arrives when another has been served alone for a while: it banks nothing, owes nothing."""
    late = 10 * TENANT_DOC_TOKENS / preset.cost.prefill_tok_per_s
    return Workload(name="tenant-late", groups=[_tenant_docs("early", 30), _tenant_docs("late", 10, arrival_s=late)])


def tenant_chats(preset: Preset) -> Workload:
    """A tenant that only chats beside a tenant flooding documents: its chats keep the chat targets."""
    span = 20 * TENANT_DOC_TOKENS / preset.cost.prefill_tok_per_s
    return Workload(
        name="tenant-chats",
        groups=[_tenant_docs("pipeline", 20), _tenant_chats("people", _chat_rate(preset, 2.0), span)],
    )


TENANT_SCENARIOS: dict[str, Callable[[Preset], Workload]] = {
    "tenant-flood": tenant_flood,
    "tenant-weights": tenant_weights,
    "tenant-late": tenant_late,
    "tenant-chats": tenant_chats,
}
"""Tenants sharing one engine (`scheduler.tenants`), sized for the preset they run on."""


OVERLOAD_SCENARIOS: dict[str, Callable[[Preset], Workload]] = {
    "kv-burst": kv_burst,
    "poisson-50": poisson_load(0.50),
    "poisson-80": poisson_load(0.80),
    "poisson-95": poisson_load(0.95),
    "doc-flood": doc_flood,
}
"""Scenarios sized for the preset they run on (the same shape and load on any card)."""


def scenario(name: str, preset: Preset) -> Workload:
    """A named scenario; the overload ones are sized for `preset`."""
    if name in OVERLOAD_SCENARIOS:
        return OVERLOAD_SCENARIOS[name](preset)
    if name in TENANT_SCENARIOS:
        return TENANT_SCENARIOS[name](preset)
    return SCENARIOS[name]()


SCENARIOS: dict[str, Callable[[], Workload]] = {
    "doc-question": doc_question,
    "doc-4sessions": doc_4sessions,
    "doc-4parallel": doc_4parallel,
    "doc-lone": doc_lone,
    "chunk-steps": chunk_steps,
    "mixed-poisson": mixed_poisson,
}
