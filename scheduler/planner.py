"""The policy for one pass: who is admitted and how many prefill tokens each gets.

Engines call `PassPlanner.plan` once per scheduling step with a `QueueSnapshot`. The planner owns
the state that lives across passes (starvation ledger, pass sizer); everything else is in the
snapshot, so decisions are deterministic — every tensor-parallel rank takes the same ones.

The engine gives the planner its pass-cost model (`scheduler.pass_cost.PassCost`), which SLO sizing reads:
``PassPlanner(cfg, pass_cost=...)`` at start, or ``planner.pass_cost = ...`` whenever the engine has a better one
(an online fit replacing its prior). None: the static pass knobs size every pass. `slo_counters` counts the passes
in which a target could not be met, the passes sized down for a short request waiting for a slot, and the passes
the model could not predict, for engines to export.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from scheduler.admission import AdmissionScan, StarvationLedger, fits
from scheduler.config import PolicyConfig
from scheduler.diagnostics import log_plan, logger
from scheduler.fair_share import align, per_request_cap, sequential_fill, top_up, water_fill
from scheduler.pass_budget import PassBudget, PassSizer
from scheduler.pass_cost import PassCost, attention_of, extend_pairs
from scheduler.slo_sizing import PassLoad, SloCounters, UnusableCost, predict
from scheduler.snapshot import Candidate, Grant, PassPlan, QueueSnapshot, Rejection
from scheduler.tenants import TenantCounters, TenantRequest, tenant_fill, walk_order, weight_of

RESCANS = 2
"""Re-scans after the pass could not run a request the scan admitted (bounds decision time)."""


class PassPlanner:
    def __init__(self, cfg: PolicyConfig | None = None, pass_cost: PassCost | None = None) -> None:
        self.cfg = cfg or PolicyConfig()
        self.pass_cost = pass_cost
        """The engine's pass-cost model for SLO sizing; None = the static pass knobs."""
        self.ledger = StarvationLedger()
        self.sizer = PassSizer()
        self.slo_counters = SloCounters()
        self.tenants = TenantCounters()
        """Each tenant's virtual token counter (`scheduler.tenants`)."""
        self.num_skip_ahead = 0
        """Requests admitted by skip-ahead since start (for metrics)."""
        self.num_plans = 0
        logger.info(self.cfg.describe_cap())

    def reconfigure(self, cfg: PolicyConfig) -> None:
        """Live knob change; state across passes is kept."""
        self.cfg = cfg
        logger.info(self.cfg.describe_cap())

    def forget(self, rid: str) -> None:
        """The engine dropped a request (finished or aborted)."""
        self.ledger.forget(rid)

    def plan(self, snap: QueueSnapshot) -> PassPlan:
        pass_index = self.num_plans if snap.pass_index is None else snap.pass_index
        self.num_plans += 1
        if self.cfg.tenant_fairness:
            self.tenants.observe(snap.tenants)
        deferred: list[str] = []
        longs: set[str] | None = None
        for attempt in range(RESCANS + 1):
            plan, admitted, shorts, past_rejection, budget = self._plan_once(snap, pass_index, set(deferred), longs)
            granted = {g.rid for g in plan.grants}
            dropped = [c.rid for c in admitted if c.rid not in granted]
            if not dropped or not self.cfg.skip_ahead:
                break  # strict FCFS keeps upstream's scan, which never re-scans
            # What the pass cannot run holds nothing: scan again without it. The first re-scan keeps the long
            # requests the pass did run; the last admits no new long request, so short ones always get a look.
            deferred += dropped
            longs = granted if attempt == 0 else set()
        plan.deferred = deferred
        plan.num_sharing = len(plan.grants)
        plan.num_skip_ahead = sum(g.rid in past_rejection for g in plan.grants)
        self.num_skip_ahead += plan.num_skip_ahead
        self._predict(plan, snap, [*snap.continuing, *admitted])
        self._commit(plan, pass_index, [c.extend_tokens for c in shorts])
        self._charge(plan, [*snap.continuing, *admitted])
        self.slo_counters.record(self.cfg, budget.size, budget.unusable_cost)
        log_plan(self.cfg, plan)
        return plan

    def replay_idle(self, snap: QueueSnapshot, previous: PassPlan, restamp: bool = True) -> PassPlan:
        """`plan(snap)`, without walking the queue, for a pass in which nothing can be admitted: `previous` was
        planned on a snapshot with the same waiting candidates (same figures, as far as its walk judged them),
        free slots, continuing requests and config, admitted nobody, and no candidate it judged fits in
        ``snap.free_kv_tokens`` (the caller checks that against `admission.free_kv_to_fit`, the walk's own
        threshold). Then the walk would judge the same requests and reject each again: the reservations of the
        ledger decide only who may overtake a request that fits, and none does. The state across passes moves as
        in `plan` (`_commit`); the pass budget and cap are sized afresh for `snap`'s pass.

        A rejection's ``rem_total_tokens`` is the free KV when it was judged, ``snap.free_kv_tokens`` in a pass
        that admits nobody: `restamp` rebuilds the rejections with it (diagnostics always do); without, they
        keep `previous`'s figure, and cost nothing per request (engines replay idle passes every iteration)."""
        if previous.grants or snap.continuing:
            raise ValueError("replay_idle replays only a pass that admitted nobody and continues nobody")
        pass_index = self.num_plans if snap.pass_index is None else snap.pass_index
        self.num_plans += 1
        rejections = previous.rejections
        if restamp or self.cfg.diagnostics:
            free_kv = snap.free_kv_tokens
            rejections = [
                r if r.rem_total_tokens == free_kv else replace(r, rem_total_tokens=free_kv) for r in rejections
            ]
        plan = PassPlan(rejections=rejections)
        plan.pass_budget_tokens = self.sizer.budget(self.cfg, pass_index, 0, snap.num_decoding, snap.num_short_decoding)
        plan.grants, plan.cap_tokens = self._allocate([], set(), plan.pass_budget_tokens, snap)
        plan.sized_by = "idle"
        # As the walk finds it: with no slot free it stops at once, leaving the short index's requests waiting.
        plan.short_left_waiting = snap.free_running_slots <= 0 and _short_left_waiting(snap, [], set(), [])
        self._commit(plan, pass_index, [])
        log_plan(self.cfg, plan)
        return plan

    def repeat_idle(self, plan: PassPlan, pass_index: int, num_decoding: int, num_short_decoding: int) -> bool:
        """Take `plan`, which `replay_idle` returned without restamping, for this pass too, if replaying it again
        would give an equal plan: the caller holds every figure a replay reads fixed (the same replayed plan, free
        slots, decoding streams, continuing requests and config, and free KV still below every judged need), so
        only the pass budget can differ, through the pass counter (`PassSizer`). Then the state across passes moves
        as a replay moves it and True is returned; otherwise nothing moves. Engines repeat idle passes every
        iteration: this costs no new plan."""
        if plan.grants or self.cfg.diagnostics:
            return False
        if self.sizer.budget(self.cfg, pass_index, 0, num_decoding, num_short_decoding) != plan.pass_budget_tokens:
            return False
        self.num_plans += 1
        self._commit(plan, pass_index, [])
        return True

    def _plan_once(
        self, snap: QueueSnapshot, pass_index: int, deferred: set[str], longs: set[str] | None
    ) -> tuple[PassPlan, list[Candidate], list[Candidate], set[str], PassBudget]:
        """One scan and its plan; also returns the admitted requests and, of them, the short ones."""
        plan = PassPlan()
        admitted, shorts, past_rejection, slot_wait = self._scan(snap, plan, pass_index, deferred, longs)
        sharers = [*snap.continuing, *admitted]
        short_ids = {c.rid for c in shorts}
        cost = self.pass_cost
        load = self._load(snap, sharers, shorts, short_ids, len(admitted), slot_wait, with_ctx=cost is not None)
        budget = self.sizer.size(self.cfg, cost, load, pass_index)
        plan.pass_budget_tokens = budget.tokens
        plan.sized_by = budget.size.by.value
        plan.pass_bound_s = budget.size.bound_s
        plan.missed_targets = tuple(t.value for t in budget.size.missed)
        plan.short_left_waiting = slot_wait
        plan.grants, plan.cap_tokens = self._allocate(sharers, short_ids, plan.pass_budget_tokens, snap)
        return plan, admitted, shorts, past_rejection, budget

    def _load(
        self,
        snap: QueueSnapshot,
        sharers: list[Candidate],
        shorts: list[Candidate],
        short_ids: set[str],
        num_admitted: int,
        slot_wait: bool,
        with_ctx: bool,
    ) -> PassLoad:
        """What the pass costs besides its long prefill (`shorts`: the short requests admitted, `short_ids` their
        rids); contexts are read only when a cost model will use them."""
        cfg = self.cfg
        long_sharers = [c for c in sharers if c.rid not in short_ids]
        short_tokens = sum(c.extend_tokens for c in shorts)
        rows = snap.num_decoding if cfg.mixed_decode else 0
        work = attention_of(self.pass_cost)
        return PassLoad(
            short_tokens=short_tokens,
            short_ctx_pairs=sum(extend_pairs(work, c.ctx_tokens, c.extend_tokens) for c in shorts) if with_ctx else 0.0,
            long_ctx_tokens=max((c.ctx_tokens for c in long_sharers), default=0) if with_ctx else 0,
            num_decoding=snap.num_decoding,
            decode_ctx_tokens=snap.decode_ctx_tokens,
            rows_ride=cfg.mixed_decode,
            num_short_decoding=snap.num_short_decoding,
            admission_lag_passes=snap.admission_lag_passes,
            output_lag_passes=snap.output_lag_passes,
            limit_long_tokens=max(0, cfg.chunk_budget_tokens - rows - short_tokens),
            num_long_sharers=len(long_sharers),
            free_running_slots=snap.free_running_slots - num_admitted,
            short_waits_for_slot=slot_wait,
        )

    def _predict(self, plan: PassPlan, snap: QueueSnapshot, sharers: list[Candidate]) -> None:
        """The model's seconds for the pass as planned (its grants at their contexts, the decode rows riding)."""
        if self.pass_cost is None or not plan.grants:
            return
        ctx = {c.rid: c.ctx_tokens for c in sharers}
        rows = snap.num_decoding if self.cfg.mixed_decode else 0
        try:
            plan.predicted_pass_s = predict(
                self.pass_cost,
                plan.num_prefill_tokens,
                sum(extend_pairs(attention_of(self.pass_cost), ctx[g.rid], g.tokens) for g in plan.grants),
                rows,
                snap.decode_ctx_tokens if rows else 0,
            )
        except UnusableCost:
            plan.predicted_pass_s = None

    def _commit(self, plan: PassPlan, pass_index: int, short_tokens: list[int]) -> None:
        """State across passes changes once per pass, from the plan that runs. `short_tokens`: the prompts of the
        short requests it admits."""
        self.sizer.commit(pass_index, short_tokens, plan.predicted_pass_s, plan.short_left_waiting)
        self.ledger.record_skips(plan.rejections, pass_index)
        for g in plan.grants:
            self.ledger.forget(g.rid)

    def _scan(
        self, snap: QueueSnapshot, plan: PassPlan, pass_index: int, deferred: set[str], longs: set[str] | None
    ) -> tuple[list[Candidate], list[Candidate], set[str], bool]:
        """Admission: walk the queue in order, collecting requests that fit in KV and slots (long ones
        leaving the interactive reserve), then the engine's index of short waiting requests past where the
        walk stopped. `deferred`: not admitted this pass; `longs`: the only long requests that may be
        admitted (None = any). Also returns the short requests admitted, the rids admitted past a capacity
        rejection, and whether a short request is left waiting with no running slot free. Each request judged is
        classified (`PolicyConfig.is_short`) once."""
        cfg = self.cfg
        scan = AdmissionScan(cfg, self.ledger, pass_index)
        free_kv = snap.free_kv_tokens
        free_slots = snap.free_running_slots
        # Requests beyond what the biggest pass could feed get nothing this pass anyway.
        demand_left = cfg.chunk_budget_tokens - sum(self._want(c) for c in snap.continuing)
        idle = not snap.continuing and not snap.num_decoding
        admitted: list[Candidate] = []
        shorts: list[Candidate] = []
        past_rejection: set[str] = set()
        examined: set[str] = set()
        judged_shorts: list[str] = []

        def consider(cand: Candidate, short: bool) -> bool:
            """Admit `cand` (`short`: it is short) if it fits; False when the walk must stop."""
            nonlocal free_kv, free_slots, demand_left
            if cand.rid in deferred:
                return True
            if short:
                judged_shorts.append(cand.rid)
            if not fits(cfg, short, cand.need_tokens, free_kv, free_slots, idle and not admitted):
                goes_on = scan.on_capacity_rejection(cand.rid)
                plan.rejections.append(
                    Rejection(
                        rid=cand.rid,
                        need_tokens=cand.need_tokens,
                        rem_total_tokens=free_kv,
                        rem_chunk_tokens=max(0, demand_left),
                        num_cut=len(snap.continuing),
                        max_cut=snap.max_cut_requests,
                        num_can_run=len(admitted),
                        skipped=goes_on,
                    )
                )
                return goes_on
            if not (longs is None or short or cand.rid in longs):
                return True  # judged (a capacity rejection still counts), not admitted in this re-scan
            if not scan.may_overtake(short):
                return True  # a long request may not pass one that holds a reservation
            admitted.append(cand)
            if short:
                shorts.append(cand)
            if plan.rejections:
                past_rejection.add(cand.rid)
            free_kv -= cand.need_tokens
            free_slots -= 1
            demand_left -= self._want(cand)
            return True

        for cand in self._walk(snap):
            if free_slots <= 0 or demand_left <= 0 or not scan.may_examine_next():
                break
            examined.add(cand.rid)
            if not consider(cand, cfg.is_short(cand.extend_tokens)):
                break
        if snap.waiting_short is not None and cfg.skip_ahead:
            scan = AdmissionScan(cfg, self.ledger, pass_index)  # its own lookahead past its own rejections
            for cand in snap.waiting_short:
                if free_slots <= 0 or demand_left <= 0 or not scan.may_examine_next():
                    break
                if cand.rid not in examined and cfg.is_short(cand.extend_tokens):  # the index may predate a reconfigure
                    consider(cand, True)
        slot_wait = free_slots <= 0 and _short_left_waiting(snap, admitted, deferred, judged_shorts)
        return admitted, shorts, past_rejection, slot_wait

    def _walk(self, snap: QueueSnapshot) -> Iterable[Candidate]:
        """The waiting queue in the order admission judges it: by tenant (`tenants.walk_order`) when tenants share
        the engine, else as queued."""
        if not self.cfg.tenant_fairness or len(snap.tenants) < 2:
            return snap.waiting
        return walk_order(snap.waiting, self.tenants, self._weight)

    def _weight(self, cand: Candidate) -> float:
        return weight_of(cand, self.cfg.tenant_weights)

    def _charge(self, plan: PassPlan, sharers: list[Candidate]) -> None:
        """Bill each tenant the prompt tokens its requests are granted in the pass."""
        if not self.cfg.tenant_fairness:
            return
        by_rid = {c.rid: c for c in sharers}
        for g in plan.grants:
            c = by_rid[g.rid]
            self.tenants.charge(c.tenant, self._weight(c), prefill_tokens=g.tokens)

    def charge_decode(self, decoded: Iterable[TenantRequest]) -> None:
        """Bill each backlogged tenant an output token per request of its that decoded in a pass (engines call it
        for each pass that decodes, planned or not). Only counters of tenants backlogged together are ever
        compared (a tenant that becomes backlogged is lifted to them), so with fewer than two it is free."""
        backlogged = self.tenants.backlogged
        if not self.cfg.tenant_fairness or len(backlogged) < 2:
            return
        for r in decoded:
            if r.tenant in backlogged:
                self.tenants.charge(r.tenant, weight_of(r, self.cfg.tenant_weights), decode_tokens=1)

    def _fill(self, wants: list[int], sharers: list[Candidate], budget: int, max_cut: int) -> list[int]:
        """Max-min shares of `budget`: among tenants by weight first when shared by tenant (`tenants.tenant_fill`),
        else among requests. A pass shared by tenants leaves one request of each cut: with room for one cut request
        (sglang), tenants take turns by admission order instead (`_walk`), and the pass is shared by request."""
        if not self.cfg.tenant_fairness or max_cut < 2:
            return water_fill(wants, budget)
        weights = {c.tenant: self._weight(c) for c in sharers}
        demands = [c.extend_tokens if w else 0 for c, w in zip(sharers, wants, strict=True)]
        return tenant_fill(wants, demands, [c.tenant for c in sharers], weights, budget)

    def _want(self, cand: Candidate) -> int:
        """What a request can take at most in a contended pass."""
        return min(cand.extend_tokens, self.cfg.cap_tokens) if self.cfg.fair_share else cand.extend_tokens

    def _allocate(
        self, sharers: list[Candidate], short_ids: set[str], budget: int, snap: QueueSnapshot
    ) -> tuple[list[Grant], int]:
        """Split the pass budget; requests that would exceed the cut limit or get nothing sit this pass out.
        `short_ids`: the newly admitted short requests among `sharers`."""
        if not sharers:  # a pass that admits nobody (engines plan one every iteration while nothing fits)
            return [], per_request_cap(self.cfg, budget, 0)
        finish: set[str] = set()
        while True:
            cap = per_request_cap(self.cfg, budget, len(sharers))
            shares = self._shares(sharers, short_ids, budget, cap, snap, finish)
            grants = [Grant(c.rid, s, cut=s < c.extend_tokens) for c, s in zip(sharers, shares, strict=True) if s > 0]
            extra = _over_cut_limit(grants, snap.max_cut_requests, snap.continuing)
            if extra is None and len(grants) == len(sharers):
                return grants, cap
            if extra is not None and (done := _finishable(grants, budget, snap.continuing, finish)):
                # Spare budget can finish a half-prefilled request, freeing the cut for the new one.
                finish.add(done)
                continue
            # Re-share without the request that cannot run: its share goes to the others. Of those the pass gives
            # nothing, the last in admission order goes first, so the first keep their turn.
            drop = extra or next(c.rid for c, s in reversed(list(zip(sharers, shares, strict=True))) if s == 0)
            sharers = [c for c in sharers if c.rid != drop]

    def _shares(
        self,
        sharers: list[Candidate],
        short_ids: set[str],
        budget: int,
        cap: int,
        snap: QueueSnapshot,
        finish: set[str],
    ) -> list[int]:
        demands = [c.extend_tokens for c in sharers]
        if not self.cfg.fair_share:
            return sequential_fill(demands, budget, snap.granule_tokens)
        # New short requests are never cut for F, nor is a request the pass should finish. A half-prefilled
        # request counts as long whatever is left of it: it was cut because it was big.
        whole = [c.rid in short_ids or c.rid in finish for c in sharers]
        wants = [d if w else min(d, cap) for d, w in zip(demands, whole, strict=True)]
        if not self.cfg.adaptive_pass:
            return align(self._fill(wants, sharers, budget, snap.max_cut_requests), demands, snap.granule_tokens)
        # The pass was sized for the short requests it admits: they are served whole first (cut, one would be a
        # second cut request and sit the pass out), the long ones share what is left, then take what caps leave.
        first = water_fill([x if w else 0 for x, w in zip(wants, whole, strict=True)], budget)
        longs = [0 if w else x for x, w in zip(wants, whole, strict=True)]
        rest = self._fill(longs, sharers, budget - sum(first), snap.max_cut_requests)
        shares = [a + b for a, b in zip(first, rest, strict=True)]
        top_up(shares, demands, budget, [i for i, w in enumerate(whole) if not w])
        return align(shares, demands, snap.granule_tokens)


def _short_left_waiting(
    snap: QueueSnapshot, admitted: list[Candidate], deferred: set[str], judged_shorts: list[str]
) -> bool:
    """Is a short request left waiting? The engine's short index says (its requests counted as short without
    reading their figures, which costs a prefix match in sglang); without one, the short requests judged."""
    taken = deferred.union(c.rid for c in admitted)
    shorts = judged_shorts if snap.waiting_short is None else (c.rid for c in snap.waiting_short)
    return any(rid not in taken for rid in shorts)


def _finishable(grants: list[Grant], budget: int, continuing: Sequence[Candidate], finish: set[str]) -> str | None:
    """A half-prefilled request, still cut, that the pass's spare budget could finish."""
    spare = budget - sum(g.tokens for g in grants)
    by_rid = {g.rid: g for g in grants}
    for c in continuing:
        g = by_rid.get(c.rid)
        if g is not None and g.cut and c.rid not in finish and c.extend_tokens - g.tokens <= spare:
            return c.rid
    return None


def _over_cut_limit(grants: list[Grant], max_cut: int, continuing: Sequence[Candidate]) -> str | None:
    """The last newly admitted request of those that would be half-prefilled one too many: the requests admitted
    first keep their place in the pass."""
    kept = {c.rid for c in continuing}
    granted = {g.rid for g in grants}
    num_cut = sum(c.rid not in granted for c in continuing)  # left out of the pass, still half-prefilled
    num_cut += sum(g.cut for g in grants)
    if num_cut <= max_cut:
        return None
    return next((g.rid for g in reversed(grants) if g.cut and g.rid not in kept), None)
