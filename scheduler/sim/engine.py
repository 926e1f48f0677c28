"""A discrete-step model of one serving engine: schedule -> execute -> update.

The scheduler (our policy core for sglang-like rules, or vLLM's rules) decides each pass; the
engine applies it, charges the pass on the cost model and records token times. The same class
runs on a virtual clock (the simulator) and in real time (the Serve app's `sim` backend).

Under an overlap scheduler (sglang's default event loop, `StepScheduler.overlap_schedule`) a pass is planned and
launched before the previous pass's results are processed. A request whose last token the previous pass sampled
has not left the running batch yet when the next pass is planned: it still holds its running slot and its KV,
its row still counts against the mixed chunk, but it decodes no more (sglang skips finishing rows). The engine
keeps such requests in `finishing` until the next pass is planned; when that pass has nothing to run, sglang
processes the results (they leave) and plans again at once, and so does `step`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scheduler.interleave import PassKind
from scheduler.pass_cost import chunk_ctx_pairs
from scheduler.sim.cost_model import CostModel
from scheduler.sim.request import Phase, SimRequest
from scheduler.sim.step_plan import StepPlan


class StepScheduler(Protocol):
    @property
    def max_running_requests(self) -> int: ...

    @property
    def overlap_schedule(self) -> bool:
        """A pass's results are processed only after the next pass is planned (sglang's overlap event loop)."""
        ...

    def plan_step(self, engine: SimEngine) -> StepPlan: ...

    def forget(self, rid: str) -> None: ...

    def is_short(self, req: SimRequest) -> bool:
        """Does the engine index this waiting request as short (`SimEngine.waiting_short`)?"""
        ...


@dataclass
class StepResult:
    start_s: float
    duration_s: float
    kind: PassKind
    num_prefill_tokens: int
    num_decode_rows: int
    prefill: dict[str, int] = field(default_factory=dict)
    """Prompt tokens each request prefilled in the pass."""
    emitted: list[tuple[str, int]] = field(default_factory=list)
    """(rid, tokens generated so far) for each request that produced a token this pass."""
    finished: list[str] = field(default_factory=list)

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


class SimEngine:
    def __init__(self, cost: CostModel, scheduler: StepScheduler) -> None:
        self.cost = cost
        self.scheduler = scheduler
        self.waiting: list[SimRequest] = []
        self.waiting_short: list[SimRequest] = []
        """The short waiting requests in queue order: an index, so the policy finds one behind many documents."""
        self.running: list[SimRequest] = []
        """Admitted requests holding a running slot and KV: prefilling, decoding, or `finishing`."""
        self.finishing: list[SimRequest] = []
        """Requests whose last token the last pass sampled, not yet released (overlap scheduler only)."""
        self.kv_used_tokens = 0
        self.num_passes = 0

    @property
    def free_kv_tokens(self) -> int:
        return self.cost.kv_pool_tokens - self.kv_used_tokens

    @property
    def free_running_slots(self) -> int:
        return self.scheduler.max_running_requests - len(self.running)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    @property
    def drained(self) -> bool:
        """Nothing left to run: nothing waits, and every running request is finishing."""
        return not self.waiting and len(self.finishing) == len(self.running)

    def add(self, req: SimRequest) -> None:
        if req.kv_need_tokens > self.cost.kv_pool_tokens:
            raise ValueError(
                f"{req.rid}: needs {req.kv_need_tokens} KV tokens, the pool holds {self.cost.kv_pool_tokens}"
            )
        self.waiting.append(req)
        if self.scheduler.is_short(req):
            self.waiting_short.append(req)

    def abort(self, rid: str) -> bool:
        """Drop a request wherever it is and free its KV. False when it is unknown or done (a finishing request
        is released at once, as finished)."""
        for req in self.finishing:
            if req.rid == rid:
                self.finishing.remove(req)
                self.running.remove(req)
                self._release(req, Phase.FINISHED)
                return False
        for queue in (self.waiting, self.running):
            for req in queue:
                if req.rid == rid:
                    queue.remove(req)
                    if req in self.waiting_short:
                        self.waiting_short.remove(req)
                    self._release(req, Phase.ABORTED)
                    return True
        return False

    def process_results(self) -> None:
        """Process the last pass's results now: its finishing requests leave. sglang's loop does so in an iteration
        that has nothing to launch (`step` does it itself then); a request that arrives at an engine that has
        nothing left to run finds them gone."""
        for req in self.finishing:
            self.running.remove(req)
            self._release(req, Phase.FINISHED)
        self.finishing.clear()

    def step(self, now_s: float) -> StepResult:
        plan = self.scheduler.plan_step(self)
        while self.finishing and not (plan.prefill or plan.decode):
            # Nothing to launch: the last pass's results are processed (its finishing requests leave), then the
            # scheduler plans again in its next iteration (sglang: an idle iteration, no forward pass).
            self.process_results()
            plan = self.scheduler.plan_step(self)
        self._admit(plan.prefill, now_s)
        by_rid = {r.rid: r for r in self.running}
        prefill = [(by_rid[rid], n) for rid, n in plan.prefill.items()]
        decode = [by_rid[rid] for rid in plan.decode]
        duration = self.cost.pass_s(
            prefill_tokens=sum(n for _, n in prefill),
            prefill_ctx_pairs=sum(chunk_ctx_pairs(r.cached_tokens + r.num_prefilled, n) for r, n in prefill),
            decode_rows=len(decode),
            decode_ctx_tokens=sum(r.context_tokens for r in decode),
        )
        result = StepResult(now_s, duration, plan.kind, sum(n for _, n in prefill), len(decode), dict(plan.prefill))
        self.process_results()  # the last pass's results are processed once this pass is launched
        self._advance(prefill, decode, result)
        self.num_passes += 1
        return result

    def _admit(self, grants: dict[str, int], now_s: float) -> None:
        admitted = [r for r in self.waiting if r.rid in grants]
        if admitted:
            self.waiting_short = [r for r in self.waiting_short if r.rid not in grants]
        for req in admitted:
            self.waiting.remove(req)
            self.running.append(req)
            req.phase = Phase.PREFILLING
            req.admitted_s = now_s
            req.kv_held_tokens = req.kv_need_tokens
            self.kv_used_tokens += req.kv_held_tokens

    def _advance(
        self, prefill: Sequence[tuple[SimRequest, int]], decode: Sequence[SimRequest], result: StepResult
    ) -> None:
        end = result.end_s
        stepped = set()
        for req, n in prefill:
            req.num_prefilled += n
            stepped.add(req.rid)
            if req.extend_tokens == 0:  # the last chunk samples the first token
                req.first_token_s = end
                self._emit(req, end, result)
        for req in decode:
            stepped.add(req.rid)
            self._emit(req, end, result)
        for req in self.running:
            if req.phase is Phase.DECODING and req.rid not in stepped:
                req.decode_passes_stalled += 1
        for rid in result.finished:
            req = next(r for r in self.running if r.rid == rid)
            req.finish_s = end
            req.phase = Phase.FINISHED
            self.finishing.append(req)
        if not self.scheduler.overlap_schedule:
            self.process_results()

    def _emit(self, req: SimRequest, end_s: float, result: StepResult) -> None:
        req.num_generated += 1
        req.token_times_s.append(end_s)
        req.phase = Phase.DECODING
        result.emitted.append((req.rid, req.num_generated))
        if req.num_generated >= req.output_tokens:
            result.finished.append(req.rid)

    def _release(self, req: SimRequest, phase: Phase) -> None:
        self.kv_used_tokens -= req.kv_held_tokens
        req.kv_held_tokens = 0
        req.phase = phase
        self.scheduler.forget(req.rid)

    def iter_decoding(self) -> Iterator[SimRequest]:
        return (r for r in self.running if r.phase is Phase.DECODING)
