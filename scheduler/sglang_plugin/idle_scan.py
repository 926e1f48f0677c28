"""The last scan that admitted nobody, and whether a new scan could decide anything else.

Upstream sglang stops scanning the waiting queue after a ``NO_TOKEN`` rejection (``batch_is_full``) until a
request leaves the running batch. With skip-ahead the plugin passes over rejections, so sglang calls it on every
scheduler iteration, and without this record each call would prefix-match the judged requests again although
nothing can be admitted while the streams decode. A pass reuses the last scan instead of matching again while:

- that scan admitted nobody, every request it judged was rejected for KV capacity, and no request was
  half-prefilled (a continuing chunk runs every pass and changes the cache);
- the waiting queue is the same list, of the same length, with the same requests where the scan judged them
  (an arrival, an abort or a reordering rescans), and the index of short waiting requests is unchanged;
- the prefix cache holds as many evictable and protected tokens as then (nothing was inserted or evicted, so
  every judged request would match the same prefix and need as much KV);
- free running slots, decoding streams, the granule and the config are the same;
- free KV is still below the least free KV with which a judged request would fit: its need, plus the interactive
  reserve for a long request (`admission.free_kv_to_fit`, the planner's own threshold). Free KV moves every
  iteration (decoding takes KV, sglang's new-token ratio decays), but only reaching that threshold can change a
  decision: then it rescans.
- with two tenants or more in the queue (tenant fairness on), the scan judged the whole queue: the walk's order
  follows the tenants' counters (`scheduler.tenants`), which decoding moves, and in another order a walk bounded by
  the lookahead could judge requests this one did not.

Where sglang's pool is a plain token pool and the scheduler is in FCFS order, a pass that free KV cannot change
(the pool's free and evictable tokens, an upper bound of what the adder would count, stay below that threshold)
skips even sglang's adder and scan setup: `_get_new_batch_prefill_raw` returns at once, as upstream's does while
``batch_is_full`` (`SchedulerPolicy.idle_pass`). Otherwise the adder is built and the check is exact.

A reused pass still runs the planner, on the figures the scan read, so the state kept across passes (the
starvation ledger, the pass sizer) moves exactly as if the requests had been matched again, and every decision is
the one a fresh scan would take. Not repeated is the prefix match itself, hence the radix cache's LRU refresh of
the judged requests' prefixes (upstream skips it too while ``batch_is_full``). Off under hierarchical caching,
where host-tier hits can change without the device tree changing. From the second pass without an adder on the
same scan, the plan is not even rebuilt: it would equal the pass before's but for the pass budget, which the
forward-pass counter can change, so the planner repeats it while that budget is the same
(`PassPlanner.repeat_idle`) and the state across passes moves as a replay's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sglang.srt.mem_cache.prefill_budget import PrefillBudget

from scheduler.admission import free_kv_to_fit
from scheduler.config import PolicyConfig
from scheduler.sglang_plugin.short_index import ShortIndex
from scheduler.sglang_plugin.translate import (
    EngineState,
    admission_lag_passes,
    kv_allocator,
    num_short_decoding,
    output_lag_passes,
    prefix_cache,
)
from scheduler.snapshot import Candidate, PassPlan

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache

    from scheduler.sglang_plugin.translate import CandidateWindow


def cache_fingerprint(tree_cache: BasePrefixCache) -> tuple[Any, Any]:
    """Changes whenever the prefix cache gains or loses tokens (an insert or an eviction)."""
    return tree_cache.evictable_size(), tree_cache.protected_size()


def min_kv_to_fit(cfg: PolicyConfig, state: EngineState, candidates: Sequence[Candidate]) -> int | float:
    """The least free KV with which one of `candidates`, all rejected in a pass that admitted nobody, would fit.
    Under the interactive reserve a long request needs its KV plus the reserve (and fits in no KV while the
    free slots are all reserved), so the threshold is the planner's own (`admission.free_kv_to_fit`), read
    with the pass's free slots and idleness, which the scan's key holds fixed."""
    idle = not state.continuing and not state.num_decoding
    return min(
        (
            free_kv_to_fit(cfg, cfg.is_short(c.extend_tokens), c.need_tokens, state.free_running_slots, idle)
            for c in candidates
        ),
        default=math.inf,
    )


def engine_key(state: EngineState) -> tuple[int, int, int, int]:
    return state.free_running_slots, state.num_decoding, state.num_short_decoding, state.granule_tokens


@dataclass(frozen=True, slots=True, eq=False)
class IdleScan:
    queue: list[Req] = field(repr=False)
    """The waiting-queue list object the scan walked (sglang replaces it after every admission)."""
    queue_len: int
    examined: list[Req] = field(repr=False)
    """The requests the planner judged, in queue order."""
    candidates: tuple[Candidate, ...]
    """Their figures as the planner read them."""
    short_candidates: tuple[Candidate, ...] | None
    """The short index's requests the planner read (`short_index`), in index order; None without the index."""
    short_index: ShortIndex | None = field(repr=False)
    short_index_version: int
    min_kv_to_fit: int | float
    """The least free KV with which a judged request would fit (`min_kv_to_fit`)."""
    plan: PassPlan = field(repr=False)
    """The plan the scan led to (it admitted nobody): what a pass reusing the scan replays."""
    cfg: PolicyConfig
    engine: tuple[int, int, int, int]
    running: tuple[Req, ...] = field(repr=False)
    """The running requests the scan counted: while the same, so is its count of short decoding streams."""
    cache: tuple[Any, Any]
    prefill_max_requests: int | None
    plain_budget: bool
    """sglang's plain token pool (`PrefillBudget`, no mamba): free KV is bounded without building an adder."""

    @classmethod
    def record(
        cls,
        sched: Scheduler,
        adder: PrefillAdder,
        state: EngineState,
        window: CandidateWindow,
        plan: PassPlan,
        cfg: PolicyConfig,
        short_window: CandidateWindow | None = None,
        short_index: ShortIndex | None = None,
    ) -> IdleScan | None:
        """The scan just planned, if a later pass may reuse it."""
        candidates = window.candidates
        shorts = short_window.candidates if short_window is not None else None
        judged = {c.rid: c for c in [*candidates, *(shorts or ())]}
        if plan.grants or state.continuing or len(plan.rejections) != len(judged):
            return None
        if cfg.tenant_fairness and len(state.tenants) > 1 and len(window.examined) < len(sched.waiting_queue):
            return None  # the walk's order follows the tenants' counters: in another, it could judge others
        if sched.enable_hierarchical_cache:
            return None
        return cls(
            queue=sched.waiting_queue,
            queue_len=len(sched.waiting_queue),
            examined=list(window.examined),
            candidates=tuple(candidates),
            short_candidates=None if shorts is None else tuple(shorts),
            short_index=short_index,
            short_index_version=-1 if short_index is None else short_index.version,
            min_kv_to_fit=min_kv_to_fit(cfg, state, list(judged.values())),
            plan=plan,
            cfg=cfg,
            engine=engine_key(state),
            running=tuple(adder.running_batch.reqs),
            cache=cache_fingerprint(prefix_cache(sched)),
            prefill_max_requests=adder.prefill_max_requests,
            plain_budget=type(adder.memory_budget) is PrefillBudget and not prefix_cache(sched).supports_mamba(),
        )

    def still_holds(self, sched: Scheduler, state: EngineState, cfg: PolicyConfig) -> bool:
        """True when a fresh scan now would judge the same requests with the same figures and admit nobody."""
        return not state.continuing and self.holds(sched, cfg, state.free_kv_tokens, engine_key(state))

    def holds(
        self, sched: Scheduler, cfg: PolicyConfig, free_kv_tokens: int, engine: tuple[int, int, int, int]
    ) -> bool:
        """`still_holds` for a pass that continues nobody, its figures given as they are read (`engine_key`)."""
        queue = sched.waiting_queue
        return (
            queue is self.queue
            and len(queue) == self.queue_len
            and free_kv_tokens < self.min_kv_to_fit
            and cfg is self.cfg
            and engine == self.engine
            and cache_fingerprint(prefix_cache(sched)) == self.cache
            and queue[: len(self.examined)] == self.examined  # identity: `Req` has no __eq__
            and (self.short_index is None or self.short_index.version == self.short_index_version)
        )

    def figures_without_adder(
        self, sched: Scheduler, running_batch: ScheduleBatch, cfg: PolicyConfig
    ) -> tuple[int, tuple[int, int, int, int]] | None:
        """Free KV and the engine's figures (`engine_key`) for a pass that may skip sglang's adder, or None when only
        an adder can tell. Read without building an `EngineState`: a pass that repeats the last needs nothing else.

        Free KV is bounded from above by the pool's free and evictable tokens (the adder subtracts the running
        requests' reservations from them); below the least free KV any judged request needs to fit, every judged
        request is still rejected whatever those reservations are now. Slots are read as the scan reads them."""
        if not self.plain_budget:
            return None
        free_kv_bound = kv_allocator(sched).available_size() + prefix_cache(sched).evictable_size() - 1
        if free_kv_bound >= self.min_kv_to_fit:
            return None
        running = running_batch.reqs
        running_now = tuple(running)
        num_short = self.engine[2] if running_now == self.running else num_short_decoding(running_now, cfg)
        free_slots = sched.get_num_allocatable_reqs(len(running), running_batch=running_batch)
        if self.prefill_max_requests is not None:
            free_slots = min(free_slots, self.prefill_max_requests)
        return free_kv_bound, (free_slots, len(running), num_short, self.engine[3])

    def state_without_adder(
        self, sched: Scheduler, running_batch: ScheduleBatch, cfg: PolicyConfig
    ) -> EngineState | None:
        """The engine state for a pass that may skip sglang's adder (`figures_without_adder`), or None."""
        figures = self.figures_without_adder(sched, running_batch, cfg)
        return None if figures is None else self.state_of(sched, *figures)

    @staticmethod
    def state_of(sched: Scheduler, free_kv_tokens: int, engine: tuple[int, int, int, int]) -> EngineState:
        free_slots, num_decoding, num_short, granule = engine
        return EngineState(
            free_kv_tokens=free_kv_tokens,
            free_running_slots=free_slots,
            continuing=(),
            num_decoding=num_decoding,
            num_short_decoding=num_short,
            granule_tokens=granule,
            pass_index=sched.forward_ct,
            admission_lag_passes=admission_lag_passes(sched),
            output_lag_passes=output_lag_passes(sched),
        )
