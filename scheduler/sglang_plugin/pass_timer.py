"""Each forward pass timed from when the device can start it to when it has run, and fed to the online pass-cost
fit (`scheduler.pass_cost_fit`).

**When a pass ends.** sglang's two loops and two kinds of device differ:

- `event_loop_normal` runs a pass (``run_batch``) and processes its result (``process_batch_result``) at once.
- `event_loop_overlap` launches pass N+1 before it processes pass N's result. On a GPU the launch returns at once
  and the device runs the passes in order, so pass N has run no later than its result was processed (its
  processing waits for the device's copy).
- On a device where a launch runs the pass before it returns (``--device cpu``: torch runs each op when it is
  called), the overlap loop launches, and so runs, pass N+1 before it processes pass N's result: the result of N
  lands after N+1 has run. Timing N up to its landing would charge it N+1's forward, which on a long document's
  chunks is a different cost from N's (measured: every chunk of a document timed as the next chunk, and the
  document's last chunk, followed by a decode pass, timed at a hundredth of its cost). There a pass ends when
  ``run_batch`` returns (`PassTimer.run_returned`).

So with ``ended`` the end above and ``launched`` the pass's ``ScheduleBatch.launch_ts`` (set by ``run_batch``):

    measured_s = ended - max(launched, previous pass's ended)

A device runs passes in order, so a pass starts no earlier than the previous pass ended: on a GPU under overlap
this is the time between consecutive result completions while passes follow each other (the loop's period per
pass: the device's time, or the scheduler's CPU time when that is longer), launch to result after an idle gap
(sglang's own prefill-throughput counter, `_record_step_counters`, draws the same boundary); on a synchronous device
it is the launch to its return, the pass's forward alone.

**What.** The figures of `PassCost.pass_s`, read from the batch as it was launched (before upstream processes
it). A row that adds one token is a decode row: a decode batch's rows, and mixed chunk's decoding rows (sglang
appends them to an extend batch as one-token extends); in a decode batch its context is its sequence length. Every
other row prefills ``extend_len`` tokens after ``prefix_len`` already in KV: `extend_pairs(work, prefix_len,
extend_len)` attention pairs, as the engine's attention kernel computes them (`AttentionWork`). A decode row in an
extend batch attends through the extend kernel: under `AttentionWork.PADDED_CAUSAL` its attention is the square
of its sequence (pairs, not context tokens). (A one-token prefill chunk counts as a decode row: it is the same
work.)

**Between passes.** On a synchronous device the loop's own work between two passes (the last result processed,
the next pass planned and built: about 5 ms on the CPU engines beside chats, more than a few hundred tokens'
forward) is in no pass. `LoopGaps` measures it, between back-to-back prefill passes, and states it as the fit's
``loop_overhead_s``, which the SLO sizer's throughput knee counts as a cost of every pass
(`scheduler.slo_sizing.throughput_knee`). The overlap loop's passes already include it.

**Not timed:** speculative decoding (several tokens a row and a draft model: figures the model does not have),
split prefill, dLLM, prebuilt (disaggregated decode) and idle (data-parallel padding) batches. Their landing still
bounds the next pass's start.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import TYPE_CHECKING, NamedTuple

from sglang.srt.model_executor.forward_batch_info import ForwardMode

from scheduler.pass_cost import AttentionWork, extend_pairs
from scheduler.pass_cost_fit import OnlinePassCost

if TYPE_CHECKING:
    import torch
    from sglang.srt.managers.schedule_batch import ScheduleBatch


MAX_HELD = 256
"""The most landings `PassTimer.landed_later` holds before it times them and feeds them to the fit. A batch's first
passes and refit run with the CPU's caches cold (a forward pass evicts the timer's and the fit's code and data),
the rest warm: on a lone decoding stream 256 passes a batch cost the loop about 20 us a pass where 64 cost 27 (a
cache-flushing loop on this project's 2-core VM), in one stop of about 3 ms every 256 passes against 1.5 ms every
64."""


class PassFigures(NamedTuple):
    """What one pass ran, in `PassCost.pass_s`'s terms. (A tuple: every pass builds one, and a frozen dataclass's
    construction costs several times a tuple's.)"""

    prefill_tokens: int
    prefill_ctx_pairs: float
    decode_rows: int
    decode_ctx_tokens: int

    def figures(self) -> PassFigures:
        return self


class TimedPass(NamedTuple):
    forward_pass: int
    """sglang's ``forward_iter`` of the pass (its ``forward_ct`` when launched)."""
    figures: PassFigures
    measured_s: float
    predicted_s: float
    """The model in force's prediction, made before the pass joined the fit's window."""


class DecodeLaunch(NamedTuple):
    """A decode batch as launched, its rows' contexts not summed yet. sglang never writes into a batch's
    ``seq_lens_cpu``: it builds a new tensor for every change (``prepare_for_decode``: "New-tensor avoids racing
    model_worker_batch refs queued for overlap forward"; ``filter_batch``, ``merge_batch`` and the overlap
    resolver's clone likewise), so the tensor held is the batch's as launched. The sum is a torch call, which in the
    scheduler loop, its caches cold after a forward pass, costs more than the rest of timing a pass: a held landing
    sums it in the timer's batch (`PassTimer.landed_later`)."""

    rows: int
    seq_lens: torch.Tensor

    def figures(self) -> PassFigures:
        return PassFigures(0, 0.0, self.rows, sum(self.seq_lens.tolist()))


Launch = PassFigures | DecodeLaunch
"""A pass's figures as read where it was launched: a decode batch's contexts may still be to sum."""


def launch_figures(batch: ScheduleBatch, work: AttentionWork = AttentionWork.QUERIES) -> Launch | None:
    """The figures of a generation batch the fit learns from, its attention counted as `work` computes it, a decode
    batch's contexts left to sum (`DecodeLaunch`); None for a batch it does not learn from (the module docstring)."""
    mode = batch.forward_mode
    if not batch.spec_algorithm.is_none() or batch.dllm_config is not None:
        return None
    if mode == ForwardMode.DECODE:
        seq_lens = batch.seq_lens_cpu
        if seq_lens is not None:
            return DecodeLaunch(len(batch.reqs), seq_lens)
        return PassFigures(0, 0.0, len(batch.reqs), sum(r.seqlen for r in batch.reqs))
    if mode != ForwardMode.EXTEND and mode != ForwardMode.MIXED:
        return None
    tokens = rows = ctx = 0
    pairs = 0.0
    padded = work is AttentionWork.PADDED_CAUSAL
    for prefix, extend in zip(batch.prefix_lens, batch.extend_lens, strict=True):
        if extend == 1 and padded:
            rows += 1
            pairs += extend_pairs(work, prefix, 1)
        elif extend == 1:
            rows += 1
            ctx += prefix + 1
        else:
            tokens += extend
            pairs += extend_pairs(work, prefix, extend)
    return PassFigures(tokens, pairs, rows, ctx)


def pass_figures(batch: ScheduleBatch, work: AttentionWork = AttentionWork.QUERIES) -> PassFigures | None:
    """`launch_figures`, summed."""
    launch = launch_figures(batch, work)
    return None if launch is None else launch.figures()


class LoopGaps:
    """The loop's own time between back-to-back prefill passes on a synchronous device: the median of the latest
    `window` gaps from one prefill pass's end to the next one's launch. A gap over `max_gap_s` is the scheduler
    waiting for work (or preempted), not its work, and is left out."""

    def __init__(self, window: int = 64, max_gap_s: float = 0.05) -> None:
        self.latest: deque[float] = deque(maxlen=window)
        self.max_gap_s = max_gap_s

    def add(self, gap_s: float) -> float | None:
        """Add one gap; the median of the latest, or None when this one was left out (nothing changed)."""
        if not 0.0 <= gap_s <= self.max_gap_s:
            return None
        self.latest.append(gap_s)
        return statistics.median(self.latest)


class PassTimer:
    """Times passes by the module docstring's rule and feeds `fit`. `synchronous_launch`: the device runs a pass
    before ``run_batch`` returns (a pass then ends there, not where its result lands)."""

    def __init__(self, fit: OnlinePassCost, synchronous_launch: bool = False) -> None:
        self.fit = fit
        self.synchronous_launch = synchronous_launch
        self.last_ended_s: float | None = None
        self.num_timed = 0
        self._returned_s: deque[tuple[int, float]] = deque()
        """(forward pass, when ``run_batch`` returned) in launch order, for passes not timed yet."""
        self._held: list[tuple[float | None, Launch | None, float, int]] = []
        """The landings `landed_later` took and did not time yet, in order."""
        self.gaps = LoopGaps()
        self._last_prefilled = False
        """The last pass timed carried prefill (a synchronous device's gap to the next one is then the loop's)."""

    def run_returned(self, forward_pass: int, returned_s: float) -> None:
        """``run_batch`` of `forward_pass` returned at `returned_s` (``time.monotonic()``)."""
        if self.synchronous_launch:
            self._returned_s.append((forward_pass, returned_s))

    def landed(
        self, launched_s: float | None, figures: Launch | None, landed_s: float, forward_pass: int
    ) -> TimedPass | None:
        """A pass launched at `launched_s` (``time.monotonic()``) had its result processed at `landed_s`; returns the
        pass as timed and predicted, or None when it is not one the fit learns from. Passes held by `landed_later`
        are timed and fed to the fit first, in order."""
        self.catch_up()
        return self._time(launched_s, figures, landed_s, forward_pass)

    def landed_later(
        self, launched_s: float | None, figures: Launch | None, landed_s: float, forward_pass: int
    ) -> None:
        """`landed`, the pass timed and fed to the fit at the next `catch_up` (at most `MAX_HELD` passes later).
        Timing is a function of the landings in order, so the fit takes the same passes in the same order and is the
        same at every read that follows a `catch_up`; meanwhile an iteration costs the scheduler loop a list append,
        and the timer's and the fit's work runs in batches whose code and data stay in the CPU's caches (a forward
        pass evicts them between two passes)."""
        self._held.append((launched_s, figures, landed_s, forward_pass))
        if len(self._held) >= MAX_HELD:
            self.catch_up()

    def catch_up(self) -> None:
        """Time the landings `landed_later` holds and feed them to the fit: call before anything reads the fit."""
        if self._held:
            held, self._held = self._held, []
            for landing in held:
                self._time(*landing)

    def _time(
        self, launched_s: float | None, launch: Launch | None, landed_s: float, forward_pass: int
    ) -> TimedPass | None:
        figures = None if launch is None else launch.figures()
        measured_s = self._measured(launched_s, figures, landed_s, forward_pass)
        return None if measured_s is None or figures is None else self._observe(forward_pass, figures, measured_s)

    def _measured(
        self, launched_s: float | None, figures: PassFigures | None, landed_s: float, forward_pass: int
    ) -> float | None:
        ended_s = self._ended(forward_pass, landed_s)
        previous, self.last_ended_s = self.last_ended_s, ended_s
        previous_prefilled = self._last_prefilled
        self._last_prefilled = figures is not None and figures.prefill_tokens > 0
        if figures is None or launched_s is None:
            return None
        if self.synchronous_launch and previous_prefilled and self._last_prefilled and previous is not None:
            overhead_s = self.gaps.add(launched_s - previous)
            if overhead_s is not None:
                self.fit.loop_overhead_s = overhead_s
        started_s = launched_s if previous is None else max(launched_s, previous)
        return ended_s - started_s

    def _observe(self, forward_pass: int, figures: PassFigures, measured_s: float) -> TimedPass | None:
        predicted_s = self.fit.observe(
            figures.prefill_tokens,
            figures.prefill_ctx_pairs,
            figures.decode_rows,
            figures.decode_ctx_tokens,
            measured_s,
        )
        if predicted_s is None:
            return None
        self.num_timed += 1
        return TimedPass(forward_pass, figures, measured_s, predicted_s)

    def _ended(self, forward_pass: int, landed_s: float) -> float:
        """When `forward_pass` ended: where its ``run_batch`` returned on a synchronous device (returns of passes
        launched before it, whose results never landed, are dropped: results land in launch order), else `landed_s`."""
        if not self.synchronous_launch:
            return landed_s
        returned = self._returned_s
        while returned and returned[0][0] < forward_pass:
            returned.popleft()
        if returned and returned[0][0] == forward_pass:
            return returned.popleft()[1]
        return landed_s
