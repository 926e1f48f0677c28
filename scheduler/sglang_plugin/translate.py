"""sglang state -> `QueueSnapshot`: what the policy core sees at the start of one prefill pass.

Every figure is read from, or computed with, the `PrefillAdder` sglang built for this pass, so the planner
judges a request the way sglang's own admission does (sglang 0.5.23, `schedule_policy.py`):

- a waiting request's ``need_tokens`` is `add_one_req`'s ``total_tokens`` (the whole uncached prompt, the
  clipped output reservation, the per-request page overhead, mamba and request-slot reserves) plus the cached
  prefix its admission locks (`locked_prefix_tokens`), and ``free_kv_tokens`` is the budget's
  ``remaining_total`` less one (sglang admits when ``total_tokens < remaining_total``) less what the
  half-prefilled request still claims: the rest of its prompt and its output (`continuing_kv_tokens`; sglang
  reserves only its next chunk, the policy core treats it as holding its KV, as the simulator does);
- ``extend_tokens`` is what a request charges the chunk budget (page-ceiled, as `_update_prefill_budget`
  charges it), so the plan's shares add up the way sglang's ``rem_chunk_tokens`` does;
- free slots are `Scheduler.get_num_allocatable_reqs` asked the way the scan asks it, less the continuing
  request (and `prefill_max_requests` when set);
- ``granule_tokens`` is the least common multiple of every alignment a cut must respect: the page, the
  KV-shard granule, ``truncation_align_size`` and the mamba chunk grid;
- a request's ``tenant`` and ``tenant_weight`` are read from its routing key (`tenant_keys`), and the snapshot's
  ``tenants`` are those of the waiting queue and the half-prefilled request;
- for the pass-cost model: a request's ``ctx_tokens`` are the tokens its next chunk attends to besides itself
  (the cached prefix it matched, host-tier hits included, or what a half-prefilled request has prefilled),
  ``decode_ctx_tokens`` the decoding streams' sequence lengths summed (their attention), and
  ``admission_lag_passes`` is 1 under sglang's overlap scheduler on an asynchronous device (a GPU: it plans a
  pass before it has read the arrivals of the pass in flight), else 0; ``output_lag_passes`` is 1 under it on a
  synchronous device (CPU: it processes a pass's results, first tokens included, once the next pass has run),
  else 0.

Waiting requests are prefix-matched (`Req.init_next_round_input`, what sglang's scan does before judging
one) only when the planner looks at them, so the scan window stays bounded by the planner's own rules.
On hybrid (mamba) models a match may take a copy-on-write state slot; the planner's match gives it back
as soon as the request's figures are read (sglang's scan matches again the requests it reaches), so the
planning adds at most one held slot at a time, as upstream's scan does, however far skip-ahead looks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast, overload

from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS

from scheduler.config import PolicyConfig
from scheduler.sglang_plugin.tenant_keys import req_tenant
from scheduler.snapshot import Candidate, QueueSnapshot

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache


class CandidateWindow(Sequence["LazyCandidate"]):
    """The waiting queue as policy candidates. A request is matched against the prefix cache (which also
    refreshes the cache's LRU order) only when the planner reads its figures, not when its iteration
    merely reaches it, so exactly the requests the planner judges are matched."""

    def __init__(
        self,
        reqs: Sequence[Req],
        tree_cache: BasePrefixCache,
        adder: PrefillAdder,
        release: Callable[[Req, BasePrefixCache], None],
    ) -> None:
        self._reqs = reqs
        self._tree_cache = tree_cache
        self._adder = adder
        self._release = release
        self._cands: list[Candidate] = []

    @property
    def examined(self) -> Sequence[Req]:
        """The requests the planner judged, in queue order."""
        return self._reqs[: len(self._cands)]

    @property
    def candidates(self) -> list[Candidate]:
        return list(self._cands)

    def __len__(self) -> int:
        return len(self._reqs)

    @overload
    def __getitem__(self, i: int) -> LazyCandidate: ...

    @overload
    def __getitem__(self, i: slice) -> list[LazyCandidate]: ...

    def __getitem__(self, i: int | slice) -> LazyCandidate | list[LazyCandidate]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self._reqs)
        return LazyCandidate(self, i, self._reqs[i])  # IndexError past the end ends the iteration

    def materialize(self, i: int) -> Candidate:
        while len(self._cands) <= i:
            req = self._reqs[len(self._cands)]
            req.init_next_round_input(self._tree_cache)
            self._cands.append(waiting_candidate(req, self._adder))
            self._release(req, self._tree_cache)  # a mamba slot the match took: not held while planning
        return self._cands[i]


class LazyCandidate:
    """A `Candidate` whose request is matched on the first read of its token figures."""

    __slots__ = ("_index", "_window", "rid", "tenant", "tenant_weight")

    def __init__(self, window: CandidateWindow, index: int, req: Req) -> None:
        self._window = window
        self._index = index
        self.rid = req.rid
        # Read without matching: the walk groups the whole queue by tenant before it judges anyone.
        self.tenant, self.tenant_weight = req_tenant(req)

    @property
    def extend_tokens(self) -> int:
        return self._window.materialize(self._index).extend_tokens

    @property
    def need_tokens(self) -> int:
        return self._window.materialize(self._index).need_tokens

    @property
    def ctx_tokens(self) -> int:
        return self._window.materialize(self._index).ctx_tokens


def locked_prefix_tokens(req: Req, adder: PrefillAdder) -> int:
    """Free KV that admitting matched `req` takes beyond its own need: the cached prefix it matched counts as
    free (evictable) until sglang's admission locks it (`PrefillAdder._lock_node`, inside which `add_one_req`
    judges). Read with sglang's own lock, so every cache and budget kind counts it its way. Upstream judges one
    request at a time against the live budget; the plan judges several against one free-KV figure, and without
    this two requests could both be counted into tokens the first one's lock takes."""
    before = adder.rem_total_tokens
    with adder._lock_node(req.last_node):
        return max(0, int(before - adder.rem_total_tokens))


def compute_tokens(adder: PrefillAdder, tokens: int) -> int:
    """What `tokens` of prefill charge the chunk budget (`PrefillAdder._update_prefill_budget`)."""
    return tokens if adder.exact_chunk_fill else adder.ceil_paged_tokens(tokens)


def waiting_candidate(req: Req, adder: PrefillAdder) -> Candidate:
    """A matched waiting request, judged as `PrefillAdder.add_one_req` / `_select_prefill_admission` do."""
    fill_len = len(req.full_untruncated_fill_ids)
    max_new = min(max(req.sampling_params.max_new_tokens - len(req.output_ids), 0), CLIP_MAX_NEW_TOKENS)
    need = (
        fill_len
        - req.prefix_len
        + max_new
        + adder.per_req_token_overhead
        + adder._mamba_gap_budget_for_req(req, include_host_hit=True)
        + adder._request_slot_reserve_for_req(req)
        + locked_prefix_tokens(req, adder)
    )
    prefix_len = req.prefix_len + req.host_hit_length
    extend = compute_tokens(adder, fill_len - prefix_len) + adder._replay_len(req, prefix_len)
    tenant, weight = req_tenant(req)
    return Candidate(req.rid, extend, need, ctx_tokens=prefix_len, tenant=tenant, tenant_weight=weight)


def continuing_candidate(req: Req, adder: PrefillAdder) -> Candidate:
    """The half-prefilled request; it holds its KV, so the planner does not judge its memory."""
    extend = compute_tokens(adder, len(req.full_untruncated_fill_ids) - req.prefix_len)
    tenant, weight = req_tenant(req)
    return Candidate(req.rid, extend, 0, ctx_tokens=req.prefix_len, tenant=tenant, tenant_weight=weight)


def continuing_chunk_tokens(req: Req, adder: PrefillAdder) -> int:
    """The chunk `PrefillAdder.add_chunked_req` gives `req` uncapped (upstream's chunk, before alignment to
    the KV-shard granule or mamba grid)."""
    remaining = len(req.full_untruncated_fill_ids) - req.prefix_len
    if adder.rem_chunk_tokens is None:
        return remaining
    available = adder.memory_budget.available_chunk_tokens(adder.rem_chunk_tokens)
    return remaining if available is None else min(remaining, available)


def continuing_kv_tokens(req: Req, adder: PrefillAdder) -> int:
    """The KV the half-prefilled request still claims: the rest of its prompt, every chunk still to come, and its
    output. The policy core treats a continuing request as holding its KV (the simulator's engine allocates a
    request's whole need at admission); sglang allocates chunk by chunk and its adder reserves only the chunk it
    continues in a pass. Upstream admits nobody beside a continuing request before its last chunk, so that is
    enough there; the plan admits requests beside it (fair share), and counting only this pass's chunk let them
    take the KV its later chunks need: a later chunk then found the pool empty (sglang: "Prefill out of memory")."""
    remaining = len(req.full_untruncated_fill_ids) - req.prefix_len
    return (
        adder.ceil_paged_tokens(remaining)
        + adder.per_req_token_overhead
        + adder._mamba_gap_budget_for_req(req)
        + adder._request_slot_reserve_for_req(req, extend_input_len=remaining)
        + min(req.sampling_params.max_new_tokens, CLIP_MAX_NEW_TOKENS)
    )


def uncached_prompt_tokens(req: Req) -> int:
    return max(0, len(req.origin_input_ids) - req.cached_tokens)


def decode_ctx_tokens(running_batch: ScheduleBatch) -> int:
    """The decoding streams' sequence lengths, summed: from the batch's CPU copy when it has one (no device sync)."""
    seq_lens = running_batch.seq_lens_cpu
    if seq_lens is not None and len(seq_lens) == len(running_batch.reqs):
        return sum(seq_lens.tolist())  # one torch call, not two
    return sum(r.seqlen for r in running_batch.reqs)


def num_short_decoding(running: Sequence[Req], cfg: PolicyConfig) -> int:
    """Decoding streams of short requests (what they did not find cached), as the pass sizer counts them."""
    return sum(cfg.is_short(uncached_prompt_tokens(r)) for r in running)


def finishing_rids(sched: Scheduler, running_batch: ScheduleBatch) -> list[str]:
    """Running requests whose last token is in flight (`Scheduler._reqs_finishing_inflight`: the overlap scheduler
    plans a pass before it processes the pass before): they keep their slot and KV until then, and decode no more."""
    return [r.rid for r in sched._reqs_finishing_inflight(running_batch)]


def mixed_decode_rows(batch: ScheduleBatch | None) -> int:
    """Decoding rows that ride along in the prefill batch `_get_new_batch_prefill_raw` built (sglang's mixed chunk):
    the running batch less the rows whose last token is still in flight (overlap scheduler), which it leaves out."""
    return len(batch.decoding_reqs) if batch is not None and batch.decoding_reqs else 0


def granule_tokens(sched: Scheduler, adder: PrefillAdder) -> int:
    return math.lcm(
        adder.page_size,
        adder.kv_shard_granule or 1,
        sched.truncation_align_size or 1,
        max(adder.mamba_chunk_grid, 1),
    )


@dataclass(frozen=True, slots=True)
class EngineState:
    """The snapshot's figures other than the waiting queue: cheap to read every pass (no prefix matching)."""

    free_kv_tokens: int
    free_running_slots: int
    continuing: tuple[Candidate, ...]
    num_decoding: int
    num_short_decoding: int
    granule_tokens: int
    pass_index: int
    """sglang's `forward_ct`: forward passes run, decode-only ones included (the simulator's count)."""
    admission_lag_passes: int = 0
    output_lag_passes: int = 0
    decode_ctx_tokens: int = 0
    """0 where it is not read (`engine_state`): only the pass-cost model uses it, and a replayed plan
    (`idle_scan`) does not ask the model."""
    tenants: frozenset[str] = frozenset()
    """The tenants with requests waiting or half-prefilled (`tenant_keys.QueueTenants`); empty where it is not read
    (`engine_state`): only a fresh plan with tenant fairness on reads it (a replayed plan walks nobody)."""

    def snapshot(self, waiting: Sequence[Candidate], waiting_short: Sequence[Candidate] | None = None) -> QueueSnapshot:
        return QueueSnapshot(
            waiting=waiting,
            waiting_short=waiting_short,
            free_kv_tokens=self.free_kv_tokens,
            free_running_slots=self.free_running_slots,
            continuing=self.continuing,
            num_decoding=self.num_decoding,
            num_short_decoding=self.num_short_decoding,
            max_cut_requests=1,  # sglang tracks one half-prefilled request (`Scheduler.chunked_req`)
            granule_tokens=self.granule_tokens,
            pass_index=self.pass_index,
            decode_ctx_tokens=self.decode_ctx_tokens,
            admission_lag_passes=self.admission_lag_passes,
            output_lag_passes=self.output_lag_passes,
            tenants=self.tenants,
        )


def engine_state(sched: Scheduler, adder: PrefillAdder, cfg: PolicyConfig, with_decode_ctx: bool = True) -> EngineState:
    """Read after the adder is built and before it admits anyone. `with_decode_ctx`: read the decoding streams'
    contexts (a tensor sum each pass; 0 without), which only the pass-cost model uses."""
    running_batch = adder.running_batch
    running_reqs = running_batch.reqs
    free_kv = int(adder.rem_total_tokens) - 1
    continuing: tuple[Candidate, ...] = ()
    held_rows = 0
    if sched.chunked_req is not None:
        continuing = (continuing_candidate(sched.chunked_req, adder),)
        free_kv -= continuing_kv_tokens(sched.chunked_req, adder)
        held_rows = int(sched.chunked_req.kv.holds_kv)
    free_slots = sched.get_num_allocatable_reqs(
        len(running_reqs), running_batch=running_batch, num_held_rows=held_rows
    ) - len(continuing)
    if adder.prefill_max_requests is not None:
        free_slots = min(free_slots, adder.prefill_max_requests - len(continuing))
    return EngineState(
        free_kv_tokens=free_kv,
        free_running_slots=free_slots,
        continuing=continuing,
        num_decoding=len(running_reqs),
        num_short_decoding=num_short_decoding(running_reqs, cfg),
        granule_tokens=granule_tokens(sched, adder),
        pass_index=sched.forward_ct,
        admission_lag_passes=admission_lag_passes(sched),
        output_lag_passes=output_lag_passes(sched),
        decode_ctx_tokens=decode_ctx_tokens(running_batch) if with_decode_ctx else 0,
    )


def admission_lag_passes(sched: Scheduler) -> int:
    """1 under the overlap scheduler on an asynchronous device: it plans the next pass while the pass in flight runs,
    so a request that arrives meanwhile waits for that next pass too. On a synchronous device (CPU) the launch runs
    the pass, and the loop reads new requests before it plans again: a request that arrives during a pass is in the
    next one (sglang 0.5.23 ``Scheduler.event_loop_overlap``: receive, plan, ``run_batch``, process the previous
    pass's results), 0."""
    return int(bool(sched.enable_overlap) and not launch_is_synchronous(sched))


def launch_is_synchronous(sched: Scheduler) -> bool:
    """Does the device run a pass before ``run_batch`` returns? On CPU torch runs each op when it is called (sglang
    still runs its overlap loop there); GPU launches are asynchronous (`pass_timer`)."""
    return str(getattr(sched, "device", "")).startswith("cpu")


def output_lag_passes(sched: Scheduler) -> int:
    """1 under the overlap scheduler on a synchronous device: it processes the results of a pass (and sends its
    first tokens) after launching the next one, which on CPU means after running it."""
    return int(bool(sched.enable_overlap) and launch_is_synchronous(sched))


def build_snapshot(
    sched: Scheduler,
    adder: PrefillAdder,
    cfg: PolicyConfig,
    release: Callable[[Req, BasePrefixCache], None],
    state: EngineState | None = None,
    shorts: Sequence[Req] | None = None,
) -> tuple[QueueSnapshot, CandidateWindow, CandidateWindow | None]:
    """The snapshot for this pass, its waiting requests matched lazily; call after the adder is built and
    before it admits anyone. `release` undoes what a match holds for a request that is not admitted
    (`adder.release_unadmitted`). `shorts`: the short waiting requests in queue order (`short_index`), also
    matched only when the planner reads them."""
    state = state or engine_state(sched, adder, cfg)
    tree_cache = prefix_cache(sched)
    window = CandidateWindow(sched.waiting_queue, tree_cache, adder, release)
    short_window = None if shorts is None else CandidateWindow(shorts, tree_cache, adder, release)
    # A `LazyCandidate` reads as a `Candidate` (the same fields; its request is matched on the first read).
    waiting, waiting_short = cast("Sequence[Candidate]", window), cast("Sequence[Candidate] | None", short_window)
    return state.snapshot(waiting, waiting_short), window, short_window


def prefix_cache(sched: Scheduler) -> BasePrefixCache:
    """The scheduler's prefix cache (`Scheduler.tree_cache`, which sglang leaves untyped)."""
    return cast("BasePrefixCache", sched.tree_cache)


def kv_allocator(sched: Scheduler) -> BaseTokenToKVPoolAllocator:
    """The scheduler's KV pool allocator (`Scheduler.token_to_kv_pool_allocator`, which sglang leaves untyped)."""
    return cast("BaseTokenToKVPoolAllocator", sched.token_to_kv_pool_allocator)
