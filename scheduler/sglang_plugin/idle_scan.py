"""The last scan that admitted nobody, and whether a new scan could decide anything else.

Upstream sglang stops scanning the waiting queue after a ``NO_TOKEN`` rejection (``batch_is_full``) until a
request leaves the running batch. With skip-ahead the plugin passes over rejections, so sglang calls it on every
scheduler iteration, and without this record each call would prefix-match the judged requests again although
nothing can be admitted while the streams decode. A pass reuses the last scan instead of matching again while:

- that scan admitted nobody, every request it judged was rejected for KV capacity, and no request was
  half-prefilled (a continuing chunk runs every pass and changes the cache);
- the waiting queue is the same list, of the same length, with the same requests where the scan judged them
  (an arrival, an abort or a reordering rescans);
- the prefix cache holds as many evictable and protected tokens as then (nothing was inserted or evicted, so
  every judged request would match the same prefix and need as much KV);
- free running slots, decoding streams, the granule and the config are the same;
- free KV is still below the smallest need rejected. Free KV moves every iteration (decoding takes KV, sglang's
  new-token ratio decays), but only reaching a rejected request's need can change a decision: then it rescans.

A reused pass still runs the planner, on the figures the scan read, so the state kept across passes (the
starvation ledger, the pass sizer) moves exactly as if the requests had been matched again, and every decision is
the one a fresh scan would take. Not repeated is the prefix match itself, hence the radix cache's LRU refresh of
the judged requests' prefixes (upstream skips it too while ``batch_is_full``). Off under hierarchical caching,
where host-tier hits can change without the device tree changing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scheduler.config import PolicyConfig
from scheduler.snapshot import Candidate, PassPlan

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

    from scheduler.sglang_plugin.translate import CandidateWindow, EngineState


def cache_fingerprint(tree_cache: Any) -> tuple[Any, Any]:
    """Changes whenever the prefix cache gains or loses tokens (an insert or an eviction)."""
    return tree_cache.evictable_size(), tree_cache.protected_size()


def engine_key(state: EngineState) -> tuple[int, int, int, int]:
    return state.free_running_slots, state.num_decoding, state.num_short_decoding, state.granule_tokens


@dataclass(frozen=True, slots=True, eq=False)
class IdleScan:
    queue: list = field(repr=False)
    """The waiting-queue list object the scan walked (sglang replaces it after every admission)."""
    queue_len: int
    examined: tuple[Req, ...] = field(repr=False)
    """The requests the planner judged, in queue order."""
    candidates: tuple[Candidate, ...]
    """Their figures as the planner read them."""
    min_rejected_need: int | float
    cfg: PolicyConfig
    engine: tuple[int, int, int, int]
    cache: tuple[Any, Any]

    @classmethod
    def record(
        cls, sched: Any, state: EngineState, window: CandidateWindow, plan: PassPlan, cfg: PolicyConfig
    ) -> IdleScan | None:
        """The scan just planned, if a later pass may reuse it."""
        candidates = window.candidates
        if plan.grants or state.continuing or len(plan.rejections) != len(candidates):
            return None
        if sched.enable_hierarchical_cache:
            return None
        return cls(
            queue=sched.waiting_queue,
            queue_len=len(sched.waiting_queue),
            examined=tuple(window.examined),
            candidates=tuple(candidates),
            min_rejected_need=min((r.need_tokens for r in plan.rejections), default=float("inf")),
            cfg=cfg,
            engine=engine_key(state),
            cache=cache_fingerprint(sched.tree_cache),
        )

    def still_holds(self, sched: Any, state: EngineState, cfg: PolicyConfig) -> bool:
        """True when a fresh scan now would judge the same requests with the same figures and admit nobody."""
        queue = sched.waiting_queue
        return (
            queue is self.queue
            and len(queue) == self.queue_len
            and state.free_kv_tokens < self.min_rejected_need
            and cfg is self.cfg
            and not state.continuing
            and engine_key(state) == self.engine
            and cache_fingerprint(sched.tree_cache) == self.cache
            and all(a is b for a, b in zip(queue, self.examined, strict=False))
        )
