"""What the policy sees of an engine at the start of a pass, and what it decides.

Engines (the simulator, the sglang plugin) translate their own request objects into these plain
records, so the policy never imports an engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.tenants import DEFAULT_TENANT


@dataclass(frozen=True, slots=True)
class Candidate:
    """A request that wants prefill work this pass."""

    rid: str
    extend_tokens: int
    """Prompt tokens still to prefill (after prefix-cache hits)."""
    need_tokens: int
    """KV tokens admission must find free: the engine's own estimate (sglang: whole prompt + reserved output)."""
    ctx_tokens: int = 0
    """Tokens already in the request's KV that its next chunk attends to (cached prefix and what is prefilled):
    what the pass-cost model charges its attention by."""
    tenant: str = DEFAULT_TENANT
    """Whom the request is billed to (`scheduler.tenants`)."""
    tenant_weight: float | None = None
    """Its tenant's weight as the request carries it (the Serve app's key table); None = the policy's."""


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """Engine state at the start of one pass."""

    waiting: Sequence[Candidate]
    """Waiting requests in queue order."""
    free_kv_tokens: int
    free_running_slots: int
    continuing: Sequence[Candidate] = ()
    """Requests already half-prefilled (sglang: at most one, its ``chunked_req``); they hold their KV."""
    num_decoding: int = 0
    """Streams decoding now; they ride along in the pass when mixed decode is on."""
    num_short_decoding: int = 0
    """Of those, streams of short requests (interactive chats whose inter-token latency matters)."""
    decode_ctx_tokens: int = 0
    """The decoding streams' contexts, summed (what their rows attend to, for the pass-cost model)."""
    admission_lag_passes: int = 0
    """Passes that start between a request's arrival and the pass that can admit it, besides the one in flight:
    1 for an engine that plans each pass before it reads the arrivals of the pass in flight (sglang's overlap
    scheduler), 0 for one that reads them at the pass boundary (the simulator). The TTFT bound counts them."""
    output_lag_passes: int = 0
    """Passes that run after the pass that computes a request's first token, before that token leaves the engine:
    1 for sglang's overlap scheduler on a device that runs a pass before its launch returns (on CPU it processes
    a pass's results once the next pass has run), 0 elsewhere (on a GPU it processes them while the next one runs).
    The TTFT bound counts them."""
    max_cut_requests: int = 1
    """How many requests may be half-prefilled after this pass (sglang: one; the article's patch: eight)."""
    granule_tokens: int = 1
    """Chunk sizes are multiples of this (page size, shard granule)."""
    pass_index: int | None = None
    """The engine's forward-pass counter (sglang: ``forward_ct``; the simulator: its step count), which the
    policy's pass-counted knobs follow. None = the planner counts the passes it plans."""
    tenants: frozenset[str] = frozenset()
    """The tenants with requests waiting or prefilling, where the engine tracks them (`scheduler.tenants`); fewer
    than two: the queue is walked as it is, and read no further than admission reads it."""
    waiting_short: Sequence[Candidate] | None = None
    """The short waiting requests in queue order, when the engine indexes them (the simulator does): a short
    request queued behind more than `lookahead` rejected documents is still found. None = the scan only."""


@dataclass(frozen=True, slots=True)
class Grant:
    rid: str
    tokens: int
    cut: bool
    """True when the request is not fully prefilled after this pass."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """One capacity rejection, with the figures of the article's diagnostic line."""

    rid: str
    need_tokens: int
    rem_total_tokens: int
    rem_chunk_tokens: int
    num_cut: int
    max_cut: int
    num_can_run: int
    skipped: bool
    """True when the scan went on past this request (skip-ahead)."""


@dataclass(slots=True)
class PassPlan:
    grants: list[Grant] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    pass_budget_tokens: int = 0
    cap_tokens: int = 0
    num_sharing: int = 0
    num_skip_ahead: int = 0
    """Requests admitted past an earlier request rejected for KV capacity (what upstream would not admit)."""
    deferred: list[str] = field(default_factory=list)
    """Requests the scan found room for but the pass could not run (a second cut request, no share left):
    they were re-scanned as not admitted, so they hold no KV or slot this pass."""
    sized_by: str = "static"
    """What set the pass budget (`scheduler.slo_sizing.SizedBy`)."""
    pass_bound_s: float | None = None
    """The most seconds the targets allow this pass (SLO sizing); None when not sized from them."""
    predicted_pass_s: float | None = None
    """The pass-cost model's seconds for the plan's grants and decode rows; None without a usable model."""
    missed_targets: tuple[str, ...] = ()
    """Targets even the smallest pass breaks (`scheduler.slo_sizing.Target`)."""
    short_left_waiting: bool = False
    """The pass leaves a short request waiting with no running slot free."""

    @property
    def num_prefill_tokens(self) -> int:
        return sum(g.tokens for g in self.grants)

    @property
    def admitted_rids(self) -> list[str]:
        return [g.rid for g in self.grants]
