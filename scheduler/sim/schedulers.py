"""Step schedulers: sglang's rules driven by our policy core, and vLLM V1's rules (the step-comparison article).

The sglang-like scheduler holds no policy of its own: every admission and chunk decision is
`PassPlanner.plan`, the code the sglang plugin runs. Upstream sglang, the article's patch and our
policy differ only in their `PolicyConfig` and in how many half-prefilled requests the engine
allows (see `rules`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, overload

from scheduler.config import PolicyConfig
from scheduler.interleave import DecodeInterleave, PassKind
from scheduler.pass_cost import PassCost
from scheduler.planner import PassPlanner
from scheduler.sim.request import Phase, SimRequest
from scheduler.sim.step_plan import StepPlan
from scheduler.snapshot import Candidate, QueueSnapshot
from scheduler.tenants import distinct_tenants

if TYPE_CHECKING:
    from scheduler.sim.engine import SimEngine


class CandidateView(Sequence[Candidate]):
    """Waiting requests as policy candidates, converted only when the policy looks at them."""

    def __init__(self, reqs: Sequence[SimRequest]) -> None:
        self._reqs = reqs

    def __len__(self) -> int:
        return len(self._reqs)

    @overload
    def __getitem__(self, i: int) -> Candidate: ...

    @overload
    def __getitem__(self, i: slice) -> list[Candidate]: ...

    def __getitem__(self, i: int | slice) -> Candidate | list[Candidate]:
        if isinstance(i, slice):
            return [to_candidate(r) for r in self._reqs[i]]
        return to_candidate(self._reqs[i])


def to_candidate(req: SimRequest) -> Candidate:
    return Candidate(
        req.rid,
        req.extend_tokens,
        req.kv_need_tokens,
        req.cached_tokens + req.num_prefilled,
        tenant=req.tenant,
        tenant_weight=req.tenant_weight,
    )


class PolicyScheduler:
    """sglang's scheduling loop with its decisions taken by the policy core. `overlap_schedule`: sglang's default
    overlap event loop (a request whose last token is in flight still holds its row when the next pass is planned:
    `SimEngine`); off = sglang's ``--disable-overlap-schedule``. `pass_cost`: the engine's cost model, which SLO
    sizing reads (the preset's; None = the static pass knobs)."""

    def __init__(
        self,
        cfg: PolicyConfig,
        max_cut_requests: int = 1,
        overlap_schedule: bool = True,
        pass_cost: PassCost | None = None,
    ) -> None:
        self.planner = PassPlanner(cfg, pass_cost=pass_cost)
        self.max_cut_requests = max_cut_requests
        self.overlap_schedule = overlap_schedule
        self.interleave = DecodeInterleave()

    @property
    def cfg(self) -> PolicyConfig:
        return self.planner.cfg

    @property
    def max_running_requests(self) -> int:
        return self.cfg.max_running_requests

    def reconfigure(self, cfg: PolicyConfig) -> None:
        self.planner.reconfigure(cfg)

    def forget(self, rid: str) -> None:
        self.planner.forget(rid)

    def is_short(self, req: SimRequest) -> bool:
        return self.cfg.is_short(req.extend_tokens)

    def plan_step(self, engine: SimEngine) -> StepPlan:
        decoding_reqs = list(engine.iter_decoding())
        decoding = [r.rid for r in decoding_reqs]
        # sglang's running batch: the finishing requests are still in it (their rows count against a mixed chunk
        # and for the interleave), but they decode no more.
        batch = [*decoding_reqs, *engine.finishing]
        if self.interleave.decode_due(len(batch)):
            self.planner.charge_decode(decoding_reqs)
            return StepPlan(PassKind.DECODE, decode=decoding)
        num_short_decoding = sum(self.cfg.is_short(r.prompt_tokens - r.cached_tokens) for r in batch)
        snap = QueueSnapshot(
            waiting=CandidateView(engine.waiting),
            free_kv_tokens=engine.free_kv_tokens,
            free_running_slots=engine.free_running_slots,
            continuing=[to_candidate(r) for r in engine.running if r.phase is Phase.PREFILLING],
            num_decoding=len(batch),
            num_short_decoding=num_short_decoding,
            decode_ctx_tokens=sum(r.context_tokens for r in decoding_reqs),
            max_cut_requests=self.max_cut_requests,
            pass_index=engine.num_passes,
            waiting_short=CandidateView(engine.waiting_short),
            tenants=distinct_tenants([*engine.waiting, *(r for r in engine.running if r.phase is Phase.PREFILLING)]),
        )
        plan = self.planner.plan(snap)
        kind = self.interleave.next_kind(self.cfg, bool(plan.grants), len(batch), num_short_decoding)
        rows = decoding if kind in (PassKind.MIXED, PassKind.DECODE) else []
        if rows:
            self.planner.charge_decode(decoding_reqs)
        return StepPlan(kind, prefill={g.rid: g.tokens for g in plan.grants}, decode=rows)


class VllmScheduler:
    """vLLM V1's `schedule()` as the step-comparison article reads it: running requests first (a decode takes one token,
    a prefill the rest of the budget), then waiting ones, all from one token budget per step."""

    def __init__(
        self,
        budget_tokens: int = 2048,
        long_prefill_token_threshold: int = 0,
        chunked: bool = True,
        max_running_requests: int = 256,
    ) -> None:
        self.budget_tokens = budget_tokens
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.chunked = chunked
        self.max_running_requests = max_running_requests
        self.overlap_schedule = False

    def forget(self, rid: str) -> None:
        pass

    def is_short(self, req: SimRequest) -> bool:
        return False  # vLLM's scan has no short-request index

    def _cap(self, need: int) -> int:
        t = self.long_prefill_token_threshold
        return t if 0 < t < need else need

    def plan_step(self, engine: SimEngine) -> StepPlan:
        budget = self.budget_tokens
        prefill: dict[str, int] = {}
        decode: list[str] = []
        for req in engine.running:
            if budget <= 0:
                break
            if req.phase is Phase.DECODING:
                decode.append(req.rid)
                budget -= 1
            elif req.phase is Phase.PREFILLING:
                n = min(self._cap(req.extend_tokens), budget)
                prefill[req.rid] = n
                budget -= n
        free_kv, free_slots = engine.free_kv_tokens, engine.free_running_slots
        for req in engine.waiting:
            need = self._cap(req.extend_tokens)
            if budget <= 0 or free_slots <= 0 or req.kv_need_tokens > free_kv:
                break
            if not self.chunked and need > budget:
                break  # chunking off: the scan stops at the first request that does not fit
            prefill[req.rid] = min(need, budget)
            budget -= prefill[req.rid]
            free_kv -= req.kv_need_tokens
            free_slots -= 1
        kind = PassKind.MIXED if prefill and decode else PassKind.PREFILL if prefill else PassKind.DECODE
        return StepPlan(kind if prefill or decode else PassKind.IDLE, prefill=prefill, decode=decode)
