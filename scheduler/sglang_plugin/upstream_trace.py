"""Upstream sglang's own pass decisions, written in the pass-trace form (`scheduler.pass_trace`).

With the plugin off (``FAIRSHARE_PLUGIN_ENABLED=0``) and ``FAIRSHARE_PASS_TRACE`` naming a file, these hooks are
the only ones registered (`loading`), so the simulator's `baseline` rule set, which every "× baseline" figure
divides by, can be compared with stock sglang pass by pass. They change no decision: the adder class sglang builds
is wrapped to watch the requests upstream's scan judges and what it answers (`RecordingAdder`), and each call of
`_get_new_batch_prefill_raw` that built an adder writes one record: the engine state as the plugin would read it
(`translate.engine_state`), the requests judged (`translate.waiting_candidate`), what was admitted and cut, the
capacity rejection that ended the scan, and the decoding rows that rode along. Without the trace nothing is hooked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sglang.srt.managers.schedule_policy import AddReqResult

from scheduler.config import PolicyConfig
from scheduler.pass_trace import ArrivalLog, PassTraceWriter, pass_record
from scheduler.sglang_plugin.env import pass_trace_path
from scheduler.sglang_plugin.policy import policy_config_for
from scheduler.sglang_plugin.translate import (
    EngineState,
    engine_state,
    finishing_rids,
    mixed_decode_rows,
    waiting_candidate,
)
from scheduler.snapshot import Candidate, Grant, PassPlan, Rejection

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.managers.scheduler import Scheduler

    # Checked as the adder it is mixed into (a `PrefillAdder` subclass); at run time a plain mixin.
    AdderMixinBase = PrefillAdder
else:
    AdderMixinBase = object

TRACE_ATTR = "_fairshare_upstream_trace"


@dataclass
class UpstreamPass:
    """What one `_get_new_batch_prefill_raw` call showed: filled in by `RecordingAdder` as upstream's scan runs."""

    queue: list[str]
    """The waiting requests when the call began, in queue order."""
    finishing: list[str]
    """The running requests whose last token was in flight when the call began."""
    cfg: PolicyConfig
    adder: RecordingAdder | None = None
    state: EngineState | None = None
    judged: list[Candidate] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    still_cut: str | None = None
    """The continuing request, when its chunk this pass did not finish it."""

    def read_state(self, sched: Scheduler) -> None:
        """The engine state before the adder admits anyone (the plugin reads it at the same point)."""
        if self.state is None:
            self.state = engine_state(sched, self.adder, self.cfg)


class RecordingAdder(AdderMixinBase):
    """Mixed in before the scheduler's adder class; upstream's answers pass through unchanged."""

    _fairshare_pass: UpstreamPass
    _fairshare_sched: Scheduler

    def __init__(self, *args: Any, fairshare_pass: UpstreamPass, fairshare_sched: Scheduler, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fairshare_pass = fairshare_pass
        self._fairshare_sched = fairshare_sched
        fairshare_pass.adder = self

    def add_chunked_req(self, req: Req) -> Req | None:
        self._fairshare_pass.read_state(self._fairshare_sched)
        still_chunked = super().add_chunked_req(req)
        self._fairshare_pass.still_cut = req.rid if still_chunked is not None else None
        return still_chunked

    def add_one_req(self, req: Req, has_chunked_req: bool, truncation_align_size: int | None) -> AddReqResult:
        seen = self._fairshare_pass
        seen.read_state(self._fairshare_sched)
        cand = waiting_candidate(req, self)
        seen.judged.append(cand)
        free_kv = int(self.rem_total_tokens) - 1
        rem_chunk = self.rem_chunk_tokens
        res = super().add_one_req(req, has_chunked_req, truncation_align_size)
        added = bool(self.can_run_list) and self.can_run_list[-1] is req
        if res is AddReqResult.NO_TOKEN and not added:
            seen.rejections.append(
                Rejection(
                    rid=req.rid,
                    need_tokens=cand.need_tokens,
                    rem_total_tokens=free_kv,
                    rem_chunk_tokens=max(0, rem_chunk or 0),
                    num_cut=int(has_chunked_req),
                    max_cut=1,
                    num_can_run=len(self.can_run_list),
                    skipped=False,
                )
            )
        return res


_RECORDING_CLASSES: dict[type[PrefillAdder], type[RecordingAdder]] = {}


def recording_adder_class(base: type[PrefillAdder]) -> type[RecordingAdder]:
    """`RecordingAdder` mixed into `base`, built once per base class."""
    cls = _RECORDING_CLASSES.get(base)
    if cls is None:
        made = type(f"Recording{base.__name__}", (RecordingAdder, base), {"__module__": __name__})
        cls = _RECORDING_CLASSES[base] = cast("type[RecordingAdder]", made)
    return cls


class UpstreamTrace:
    """One scheduler's trace of upstream's decisions."""

    def __init__(self, sched: Scheduler, path: Path) -> None:
        self.writer = PassTraceWriter(path, source=f"sglang-upstream-tp{getattr(sched, 'tp_rank', 0)}")
        self.cfg = policy_config_for(sched)
        """Only what `engine_state` reads from it: which decoding streams count as short."""
        self.arrivals = ArrivalLog()
        self.num_passes = 0
        self.current: UpstreamPass | None = None

    def begin(self, sched: Scheduler, running_batch: ScheduleBatch) -> None:
        self.current = UpstreamPass(
            [r.rid for r in sched.waiting_queue], finishing_rids(sched, running_batch), self.cfg
        )

    def end(self, sched: Scheduler, batch: ScheduleBatch | None) -> None:
        seen, self.current = self.current, None
        if seen is None or seen.adder is None:
            return  # upstream returned before building an adder: nothing was decided
        seen.read_state(sched)
        adder = seen.adder
        admitted = [(r.rid, int(r.extend_len)) for r in adder.can_run_list]
        new_cut: Req | None = adder.new_chunked_req
        cut = {new_cut.rid if new_cut is not None else None, seen.still_cut} - {None}
        plan = PassPlan(
            grants=[Grant(rid, tokens, rid in cut) for rid, tokens in admitted],
            rejections=seen.rejections,
            pass_budget_tokens=int(sched.chunked_prefill_size or 0),
        )
        snap = seen.state.snapshot([Candidate(rid, 0, 0) for rid in seen.queue])
        arrived = self.arrivals.arrived(seen.queue)
        rows = mixed_decode_rows(batch)
        record = pass_record(self.num_passes, snap, seen.judged, plan, admitted, rows, arrived, seen.finishing)
        self.writer.write(record)
        self.num_passes += 1


def trace_of(sched: Scheduler) -> UpstreamTrace:
    trace = sched.__dict__.get(TRACE_ATTR)
    if trace is None:
        trace = sched.__dict__[TRACE_ATTR] = UpstreamTrace(sched, pass_trace_path())
    return trace


def around_get_prefill_adder_class(
    original: Callable[[Scheduler], type[PrefillAdder]], sched: Scheduler
) -> Callable[..., PrefillAdder]:
    base = original(sched)
    seen = trace_of(sched).current
    if seen is None:
        return base
    return functools.partial(recording_adder_class(base), fairshare_pass=seen, fairshare_sched=sched)


def around_get_new_batch_prefill_raw(
    original: Callable[..., tuple[ScheduleBatch | None, ScheduleBatch]], sched: Scheduler, *args: Any, **kwargs: Any
) -> tuple[ScheduleBatch | None, ScheduleBatch]:
    trace = trace_of(sched)
    trace.begin(sched, kwargs["running_batch"] if "running_batch" in kwargs else args[1])
    batch = None
    try:
        batch, running_batch = original(sched, *args, **kwargs)
        return batch, running_batch
    finally:
        trace.end(sched, batch)
