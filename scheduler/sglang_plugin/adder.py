"""Apply one `PassPlan` through sglang's own `PrefillAdder`.

sglang's `_get_new_batch_prefill_raw` runs unchanged: it continues the chunked request, then scans the
waiting queue calling `add_one_req`. The adder class it uses (`Scheduler.get_prefill_adder_class`, the
intended extension point) is wrapped in `FairShareAdder`, which plans the pass once with the policy core
and then answers for each request the scan reaches:

- admitted by the plan: sglang's own `add_one_req` commits it, with the chunk budget lowered to the
  plan's grant while a request is being cut (for the continuing request, `chunked_req_limit`, which
  upstream already honours); sglang's checks still have the last word — a refusal ends the scan as
  upstream's would with skip-ahead off, and is passed over with it on;
- the plan's stopping rejection (skip-ahead off): sglang's own `add_one_req` judges it, so the
  ``NO_TOKEN`` handling (``batch_is_full``, cleanup, ``break``) is upstream's;
- examined but not admitted: upstream's rejection cleanup, and the scan goes on;
- not examined by the plan (past the lookahead): ``OTHER``, the scan ends, upstream cleans up.

Once the plan's last admission is applied `budget_state` reports ``OTHER``, so the scan stops without
looking further. The upstream invariant of one half-prefilled request is enforced explicitly: a request
that would be a second cut request is refused.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from enum import Enum
from itertools import islice
from typing import TYPE_CHECKING, Any, cast

from sglang.srt.managers.schedule_policy import AddReqResult

from scheduler.fair_share import align_down
from scheduler.pass_cost_fit import OnlinePassCost
from scheduler.planner import PassPlanner
from scheduler.sglang_plugin.clock import PluginClock
from scheduler.sglang_plugin.idle_scan import IdleScan
from scheduler.sglang_plugin.short_index import ShortIndex
from scheduler.sglang_plugin.tenant_keys import QueueTenants
from scheduler.sglang_plugin.translate import (
    CandidateWindow,
    EngineState,
    build_snapshot,
    continuing_chunk_tokens,
    decode_ctx_tokens,
    engine_state,
    prefix_cache,
)
from scheduler.snapshot import Candidate, Grant, PassPlan, QueueSnapshot

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool


def release_unadmitted(req: Req, tree_cache: BasePrefixCache) -> None:
    """Upstream's cleanup for a matched request it does not admit (`scheduler.py`, after ``add_one_req``):
    ``init_next_round_input`` may stage a mamba copy-on-write and allocate a fresh mamba slot. Idempotent.
    Session-held slots have their own lifecycle and are left alone, as upstream does."""
    req.kv.mamba_cow_src_index = None
    req.kv.mamba_needs_clear = False
    if req.kv.holds_mamba and not getattr(req, "session", None):
        pool = cast("HybridReqToTokenPool", tree_cache.req_to_token_pool)  # a mamba slot implies a hybrid pool
        pool.mamba_allocator.free(req.kv.mamba_pool_idx.unsqueeze(-1))
        req.kv.mamba_pool_idx = None


class Route(Enum):
    ADMIT = "admit"
    DELEGATE = "delegate"
    SKIP = "skip"
    OUTSIDE = "outside"


class PassRun:
    """One prefill pass under the policy: planned once, then consulted for each request sglang reaches."""

    def __init__(
        self,
        sched: Scheduler,
        planner: PassPlanner,
        last_idle_scan: IdleScan | None = None,
        clock: PluginClock | None = None,
        short_index: ShortIndex | None = None,
        traced: bool = False,
        queue_tenants: QueueTenants | None = None,
    ) -> None:
        self.sched = sched
        self.planner = planner
        self.adder: PrefillAdder | None = None
        self.snapshot: QueueSnapshot | None = None
        self.plan: PassPlan | None = None
        self.window: CandidateWindow | IdleScan | None = None
        """The requests the planner judged (`examined`) and their figures (`candidates`)."""
        self.reused_scan = False
        """True when the pass planned on the last idle scan's figures instead of matching requests again."""
        self.idle_scan: IdleScan | None = None
        """This pass's scan, if it admitted nobody and a later pass may reuse it."""
        self._last_idle_scan = last_idle_scan
        self._short_index = short_index
        self._queue_tenants = queue_tenants
        """Where a fresh plan reads the queue's tenants from, with tenant fairness on (None: one tenant)."""
        self.short_window: CandidateWindow | None = None
        """The short index's requests, as the planner read them (`short_index`)."""
        self._clock = clock
        self._traced = traced
        """The pass trace reads the rejections' free-KV figure: a reused scan's are restamped (`replay_idle`)."""
        self.continuing_cut = False
        """True once the continuing request was added and is still not fully prefilled."""
        self._grants: dict[str, Grant] = {}
        self._examined: set[str] = set()
        self._pending: set[str] = set()
        self._stop_rid: str | None = None

    @property
    def skip_ahead(self) -> bool:
        return self.planner.cfg.skip_ahead

    def bind(self, adder: PrefillAdder) -> None:
        self.adder = adder

    def ensure_plan(self) -> PassPlan:
        if self.plan is None:
            if self._clock is None:
                self._plan()
            else:
                self._clock.timed(self._plan)
        return self.plan

    def _plan(self) -> None:
        """Plan the pass: on the last idle scan while it holds, else by matching the requests the planner reads.
        The decoding streams' contexts are read only where a figure depends on them: a fresh plan whose pass-cost
        model predicts, and the pass trace, which records them; the queue's tenants only for a fresh plan that shares
        passes among tenants."""
        cfg = self.planner.cfg
        state = engine_state(self.sched, self.adder, cfg, with_decode_ctx=self._traced)
        last = self._last_idle_scan
        if last is not None and last.still_holds(self.sched, state, cfg):
            self._plan_on(last, state)
            self._index_plan()
        else:
            if not self._traced and self._cost_predicts:
                state = replace(state, decode_ctx_tokens=decode_ctx_tokens(self.adder.running_batch))
            if cfg.tenant_fairness and self._queue_tenants is not None:
                state = replace(state, tenants=self._queue_tenants.read(self.sched))
            index = self._short_index if cfg.skip_ahead else None
            shorts = index.reqs if index is not None else None
            self.snapshot, window, self.short_window = build_snapshot(
                self.sched, self.adder, cfg, release_unadmitted, state, shorts
            )
            self.window = window
            self.plan = self.planner.plan(self.snapshot)
            self.idle_scan = IdleScan.record(
                self.sched, self.adder, state, window, self.plan, cfg, self.short_window, index
            )
            self._index_plan()
            self._bring_forward_deep_grants()

    @property
    def _cost_predicts(self) -> bool:
        """Does the planner's pass-cost model answer figures? (The online fit does not before its first fit.)"""
        cost = self.planner.pass_cost
        return cost is not None and (not isinstance(cost, OnlinePassCost) or cost.predicts)

    def plan_without_adder(self, state: EngineState) -> None:
        """Plan a pass sglang will not build an adder for (`SchedulerPolicy.idle_pass`): on the last idle
        scan, which `state` (read without an adder) shows to still hold. No scan will ask for routes."""
        assert self._last_idle_scan is not None
        self._plan_on(self._last_idle_scan, state)

    def _plan_on(self, scan: IdleScan, state: EngineState) -> None:
        """Plan on the figures `scan` read: the same decisions a fresh scan would take (`idle_scan`), replayed by
        the planner without walking them again (`PassPlanner.replay_idle`)."""
        self.reused_scan = True
        self.window = scan
        self.snapshot = state.snapshot(scan.candidates, scan.short_candidates)
        self.plan = self.planner.replay_idle(self.snapshot, scan.plan, restamp=self._traced)
        self.idle_scan = None if self.plan.grants else scan

    def judged_shorts(self) -> list[Candidate]:
        """The short index's requests the planner read that its walk had not judged (for the pass trace)."""
        shorts: Sequence[Candidate]
        if self.reused_scan:
            assert isinstance(self.window, IdleScan)  # a reused scan planned on its figures
            shorts = self.window.short_candidates or ()
        else:
            shorts = self.short_window.candidates if self.short_window is not None else ()
        walked = {c.rid for c in self.window.candidates}
        return [c for c in shorts if c.rid not in walked]

    def _bring_forward_deep_grants(self) -> None:
        """Move the requests the plan admitted from the short index, past what the walk judged, to just behind
        it in sglang's queue, so that sglang's scan reaches them without prefix-matching every document between
        (it matches each request it reaches). In place: sglang's scan loop iterates this very list, and is at
        most at its first request when the plan is made; the move is behind the walk's first request."""
        if self.short_window is None or not self.plan.grants:
            return
        examined = self.window.examined
        judged = {id(r) for r in examined}
        granted = set(self._grants)
        deep = [r for r in self.short_window.examined if r.rid in granted and id(r) not in judged]
        if not deep:
            return
        queue = self.sched.waiting_queue
        moving = {id(r) for r in deep}
        rest = [r for r in islice(queue, len(examined), None) if id(r) not in moving]
        queue[len(examined) :] = [*deep, *rest]
        if self._short_index is not None:
            self._short_index.invalidate()

    def _index_plan(self) -> None:
        continuing = {c.rid for c in self.snapshot.continuing}
        self._grants = {g.rid: g for g in self.plan.grants}
        self._examined = {r.rid for r in self.window.examined}
        if self.short_window is not None:
            self._examined.update(r.rid for r in self.short_window.examined)
        self._pending = {g.rid for g in self.plan.grants if g.rid not in continuing}
        self._stop_rid = next((r.rid for r in self.plan.rejections if not r.skipped), None)
        if self._stop_rid is not None:
            self._pending.add(self._stop_rid)

    @property
    def exhausted(self) -> bool:
        """Nothing the plan decided is left for the scan to reach."""
        self.ensure_plan()
        return not self._pending

    def grant(self, rid: str) -> Grant | None:
        self.ensure_plan()
        return self._grants.get(rid)

    def continuing_limit(self, req: Req) -> int | None:
        """`chunked_req_limit` for the continuing request; None leaves upstream's chunk."""
        grant = self.grant(req.rid)
        granule = self.snapshot.granule_tokens
        if grant is None:
            # The plan gave it nothing (its share rounded to zero), but a chunked request runs in every
            # prefill pass until done (sglang counts its in-flight chunks): the smallest aligned step.
            return granule
        if not grant.cut or grant.tokens >= align_down(continuing_chunk_tokens(req, self.adder), granule):
            return None  # the grant is sglang's own chunk, at most rounded to the granule: leave it whole
        return grant.tokens

    def route(self, req: Req) -> Route:
        self.ensure_plan()
        self._pending.discard(req.rid)
        if req.rid in self._grants:
            return Route.ADMIT
        if req.rid == self._stop_rid:
            return Route.DELEGATE
        if req.rid in self._examined:
            return Route.SKIP
        return Route.OUTSIDE

    def finish(self) -> None:
        """After sglang's scan: clean up every request the plan matched that was not admitted (some never
        reached `add_one_req`: the scan ended early, or skipped them for LoRA or pooling mode). A reused scan
        matched nobody this pass: its requests were cleaned up when they were matched."""
        if self.window is None or self.reused_scan:
            return
        admitted = {id(r) for r in self.adder.can_run_list}
        shorts = self.short_window.examined if self.short_window is not None else ()
        for req in [*self.window.examined, *shorts]:
            if id(req) not in admitted:
                release_unadmitted(req, prefix_cache(self.sched))


if TYPE_CHECKING:
    _AdderBase = PrefillAdder  # checked against upstream's adder, which it is mixed in before
else:
    _AdderBase = object


class FairShareAdder(_AdderBase):
    """Mixed in before the scheduler's adder class (`PrefillAdder` upstream); see the module docstring."""

    _fairshare_run: PassRun

    def __init__(self, *args: Any, fairshare_run: PassRun, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fairshare_run = fairshare_run
        fairshare_run.bind(self)

    def add_chunked_req(self, req: Req) -> Req | None:
        limit = self._fairshare_run.continuing_limit(req)
        if limit is not None and self.rem_chunk_tokens is not None:
            # Upstream may have set a limit already (shortest-prefill-first); the smaller one holds.
            self.chunked_req_limit = limit if self.chunked_req_limit is None else min(self.chunked_req_limit, limit)
        still_chunked = super().add_chunked_req(req)
        self._fairshare_run.continuing_cut = still_chunked is not None
        return still_chunked

    def add_one_req(self, req: Req, has_chunked_req: bool, truncation_align_size: int | None) -> AddReqResult:
        run = self._fairshare_run
        route = run.route(req)
        if route is Route.OUTSIDE:
            return AddReqResult.OTHER  # past what the plan examined: the scan ends here
        if route is Route.DELEGATE:
            return super().add_one_req(req, has_chunked_req, truncation_align_size)
        if route is Route.SKIP:
            release_unadmitted(req, self.tree_cache)
            return AddReqResult.CONTINUE  # not admitted this pass; skip-ahead goes on to the next
        grant = run.grant(req.rid)
        with self._chunk_limit(grant.tokens if grant.cut else None):
            res = super().add_one_req(req, has_chunked_req, truncation_align_size)
        if self.can_run_list and self.can_run_list[-1] is req:
            return self.budget_state()  # admitted; the verdict is about the next request
        if run.skip_ahead:
            # sglang's own check refused what the plan admitted: passed over like any capacity rejection.
            release_unadmitted(req, self.tree_cache)
            return AddReqResult.CONTINUE
        return res  # strict FCFS: upstream's refusal ends the scan, with upstream's handling

    def budget_state(self) -> AddReqResult:
        res = super().budget_state()
        run = getattr(self, "_fairshare_run", None)
        if res is AddReqResult.CONTINUE and run is not None and run.exhausted:
            return AddReqResult.OTHER  # the plan admits nobody else this pass
        return res

    def _select_prefill_admission(self, req: Req, **kwargs: Any) -> Any:
        admission = super()._select_prefill_admission(req, **kwargs)
        if (
            not isinstance(admission, AddReqResult)
            and admission.is_chunked
            and (kwargs.get("has_chunked_req", False) or self.new_chunked_req is not None)
        ):
            return AddReqResult.OTHER  # one half-prefilled request at a time; a second cut would assert
        return admission

    def add_one_req_ignore_eos(self, req: Req) -> AddReqResult:
        # The ignore-EOS path (radix cache off) cuts without `_select_prefill_admission`; same invariant.
        would_cut = self.rem_chunk_tokens is not None and (
            len(req.full_untruncated_fill_ids) - req.prefix_len > self.rem_chunk_tokens
        )
        if would_cut and (self._fairshare_run.continuing_cut or self.new_chunked_req is not None):
            return AddReqResult.OTHER
        return super().add_one_req_ignore_eos(req)

    @contextmanager
    def _chunk_limit(self, tokens: int | None) -> Iterator[None]:
        """Lower the chunk budget to `tokens` while one request is judged; charge what it used."""
        before = self.rem_chunk_tokens
        if tokens is None or before is None or tokens >= before:
            yield
            return
        self.rem_chunk_tokens = tokens
        try:
            yield
        finally:
            self.rem_chunk_tokens = before - (tokens - self.rem_chunk_tokens)


@functools.cache
def fair_share_adder_class(base: type) -> type:
    """`FairShareAdder` over whatever adder class the scheduler uses (another plugin may have replaced it)."""
    return type(f"FairShare{base.__name__}", (FairShareAdder, base), {"__module__": __name__})


def adder_factory(base: type, run: PassRun) -> functools.partial[FairShareAdder]:
    """What `get_prefill_adder_class` returns: called by sglang with the adder's usual arguments."""
    return functools.partial(fair_share_adder_class(base), fairshare_run=run)
