"""Backpressure, as a pure policy: may a replica take one more request, and what to answer when none may.

A replica is judged by two per-replica limits (`BackpressureLimits`), each on what it
publishes in its `ReplicaLoad`:

- **queued requests**: requests without a first token yet (waiting + prefilling): what a new
  chat queues behind;
- **queued prefill tokens**: uncached prompt tokens still to prefill. A 130k-token document is
  130k tokens of load, not one request. A replica whose token queue is empty always takes one
  request, so a document as large as the context window is never refused forever.

Across replicas (`decide`): a request goes to any replica that admits it (the lane router then
chooses among those); when none does it is shed with 429 and a `Retry-After` sized by how long
the least-loaded replica needs to drain the excess; with no replica at all the answer is 503.

A tenant's own limit at the router (`tenant_limits`) sheds with the same `Shed` and `Retry-After`.

Two places apply the replicas' limits. The lane router (`lane_policy`, from the loads and limits replicas publish)
routes only to a replica that admits the request and sheds at the ingress when no replica its lanes allow
does (`LanesFull`); each engine replica checks its own live load again before the engine sees the
request, the last guarantee, since published loads are up to one stats period old. Both leave the
in-flight limit to Serve, which knows it exactly and enforces it before either sees the request (a replica at
`max_ongoing_requests` is full: Serve holds the request in the handle's queue, up to `max_queued_requests`, then
answers 429); a second count here could only disagree with Serve's.

The policy sees only plain records (no Ray, no HTTP), so every decision is tested with synthetic
loads; the ingress answers a `Shed` with `Shed.error()`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serve_app.protocol.errors import OpenAIError, retry_code
from serve_app.replica.backend import ReplicaLoad

_T = TypeVar("_T")

MAX_QUEUE_DELAY_S = 60.0
"""Default bound on the prefill work queued on a replica, in seconds of prefill at its rate."""


class ShedReason(StrEnum):
    QUEUED = "queued-requests"
    PREFILL_TOKENS = "queued-prefill-tokens"
    TENANT_PREFILL_TOKENS = "tenant-queued-prefill-tokens"
    NO_REPLICA = "no-replica"


class BackpressureLimits(BaseModel):
    """Per-replica limits. `derive_limits` sets them from the deployment's existing knobs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_queued_requests: int = Field(
        20, ge=1, description="Requests on one replica that have not produced their first token."
    )
    max_queued_prefill_tokens: int = Field(
        262_144, ge=1, description="Uncached prompt tokens queued for prefill on one replica."
    )
    retry_after_s: int = Field(1, ge=1, description="Least `Retry-After` on a 429 or 503.")
    max_retry_after_s: int = Field(60, ge=1, description="Largest `Retry-After` on a 429.")
    prefill_tokens_per_s: float | None = Field(
        None, gt=0, description="A replica's prefill rate; sizes `Retry-After` by the tokens to drain. None: fixed."
    )

    @model_validator(mode="after")
    def _retry_bounds(self) -> Self:
        if self.max_retry_after_s < self.retry_after_s:
            raise ValueError(
                f"max_retry_after_s ({self.max_retry_after_s}) is below retry_after_s ({self.retry_after_s})"
            )
        return self


def derive_limits(
    *,
    prefill_concurrency: int,
    context_limit_tokens: int,
    prefill_tokens_per_s: float | None = None,
    max_queue_delay_s: float = MAX_QUEUE_DELAY_S,
) -> BackpressureLimits:
    """Limits from knobs the deployment already has, so nothing is configured twice.

    - queued requests: the policy's prefill concurrency N (`PolicyConfig.prefill_concurrency`):
      beyond N requests waiting for prefill, fair-share chunking gives each less than its cap F,
      so a chat's first token slips past the design point;
    - queued prefill tokens: `max_queue_delay_s` of prefill at the replica's rate, and never less
      than one full context window (without a rate: two windows).
    """
    if prefill_tokens_per_s is not None:
        tokens = max(context_limit_tokens, int(prefill_tokens_per_s * max_queue_delay_s))
    else:
        tokens = 2 * context_limit_tokens
    return BackpressureLimits(
        max_queued_requests=prefill_concurrency,
        max_queued_prefill_tokens=tokens,
        prefill_tokens_per_s=prefill_tokens_per_s,
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """One replica's answer to one request."""

    admits: bool
    reason: ShedReason | None = None
    excess_tokens: int = 0
    """Queued prefill tokens above the limit if this request were added (0 unless PREFILL_TOKENS)."""


def assess(load: ReplicaLoad, request_tokens: int, limits: BackpressureLimits) -> Verdict:
    """May this replica take a request with `request_tokens` uncached prompt tokens? (Requests in flight are Serve's
    limit, `max_ongoing_requests`: a full replica never gets one.)"""
    if load.num_pending >= limits.max_queued_requests:
        return Verdict(False, ShedReason.QUEUED)
    queued = load.prefill_tokens + request_tokens
    # An empty token queue takes any one request: a window-sized document must be admissible somewhere.
    if load.prefill_tokens > 0 and queued > limits.max_queued_prefill_tokens:
        return Verdict(False, ShedReason.PREFILL_TOKENS, queued - limits.max_queued_prefill_tokens)
    return Verdict(True)


@dataclass(frozen=True, slots=True)
class Admit:
    replica_ids: tuple[str, ...]
    """Replicas that admit the request, in the order given; the lane router chooses among them."""


@dataclass(frozen=True, slots=True)
class Shed:
    """Refuse the request: 429 (every replica is over a limit) or 503 (no replica)."""

    status: int
    reason: ShedReason
    retry_after_s: int
    message: str

    @property
    def code(self) -> str:
        return retry_code(self.status)

    def error(self) -> OpenAIError:
        """The answer: status, `Retry-After` and OpenAI's error body."""
        return OpenAIError.retry_later(self.status, self.message, self.retry_after_s)


class LanesFull(Exception):
    """Raised to the caller of the engine handle when the lane router sheds a request (every replica its lanes
    allow is over a limit); the ingress answers `shed.error()`."""

    def __init__(self, shed: Shed) -> None:
        super().__init__(shed)
        self.shed = shed


Limits = BackpressureLimits | Mapping[str, BackpressureLimits]
"""One set of limits for every replica, or each replica's own (what it published)."""


def decide(loads: Mapping[str, ReplicaLoad], request_tokens: int | Mapping[str, int], limits: Limits) -> Admit | Shed:
    """Admit to the replicas that take the request, or shed it.

    `request_tokens` is the request's uncached prompt, one number or per replica (a session's
    cached prefix makes it smaller where the cache is); `limits` likewise.
    """
    if not loads:
        retry = limits.retry_after_s if isinstance(limits, BackpressureLimits) else BackpressureLimits().retry_after_s
        return Shed(503, ShedReason.NO_REPLICA, retry, "No engine replica is available; retry shortly.")
    verdicts = {rid: assess(load, _on(request_tokens, rid), _on(limits, rid)) for rid, load in loads.items()}
    admitting = tuple(rid for rid, v in verdicts.items() if v.admits)
    if admitting:
        return Admit(admitting)
    return shed_of(verdicts, limits)


def _on(value: _T | Mapping[str, _T], replica_id: str) -> _T:
    return value[replica_id] if isinstance(value, Mapping) else value


def shed_of(verdicts: Mapping[str, Verdict], all_limits: Limits) -> Shed:
    """The 429 for a request every replica in `verdicts` refused (each verdict refuses)."""
    reasons = {v.reason for v in verdicts.values()}
    if reasons == {ShedReason.PREFILL_TOKENS}:
        # Only tokens stand in the way: the wait is the least excess at the prefill rate.
        rid = min(verdicts, key=lambda r: verdicts[r].excess_tokens)
        excess, limits = verdicts[rid].excess_tokens, _on(all_limits, rid)
        return Shed(
            429,
            ShedReason.PREFILL_TOKENS,
            retry_after_s(excess, limits),
            f"Every engine replica that can serve this request has more than {limits.max_queued_prefill_tokens} "
            f"prompt tokens queued for prefill with this request ({excess} over); retry later.",
        )
    limits = _on(all_limits, next(rid for rid, v in verdicts.items() if v.reason is ShedReason.QUEUED))
    return Shed(
        429,
        ShedReason.QUEUED,
        limits.retry_after_s,
        f"Every engine replica that can serve this request has {limits.max_queued_requests} requests waiting for a "
        "first token (its limit); retry shortly.",
    )


def retry_after_s(excess_tokens: int, limits: BackpressureLimits) -> int:
    """Seconds until `excess_tokens` of prefill have drained, within [retry_after_s, max_retry_after_s]."""
    if limits.prefill_tokens_per_s is None:
        return limits.retry_after_s
    wait = math.ceil(excess_tokens / limits.prefill_tokens_per_s)
    return min(limits.max_retry_after_s, max(limits.retry_after_s, wait))
