"""Each forward pass timed where its result lands, and fed to the online pass-cost fit (`scheduler.pass_cost_fit`).

**Where.** At the end of `Scheduler.process_batch_result`, which processes a pass's result (its sampled tokens,
finished requests) in both of sglang's loops. In `event_loop_normal` it follows `run_batch` at once. In
`event_loop_overlap` sglang launches the next pass before it processes this one's result, so a pass's launch
(`ScheduleBatch.launch_ts`, set by `run_batch`) is no start: the device is still running the pass before. The
device runs passes in order, so a pass starts no earlier than the previous pass's result landed:

    measured_s = landed - max(launched, previous landed)

that is, the time between consecutive result completions while passes follow each other, and launch to result
after an idle gap (sglang's own prefill-throughput counter, `_record_step_counters`, draws the same boundary).
In steady overlap this is the loop's period per pass: the device's time for the pass, or the scheduler's CPU
time when that is longer; what a pass costs in the loop either way. It includes the processing of the result.

**What.** The figures of `PassCost.pass_s`, read from the batch as it was launched (before upstream processes
it). A row that adds one token is a decode row: a decode batch's rows, and mixed chunk's decoding rows (sglang
appends them to an extend batch as one-token extends); its context is its sequence length. Every other row
prefills ``extend_len`` tokens after ``prefix_len`` already in KV: `chunk_ctx_pairs(prefix_len, extend_len)`
attention pairs. (A one-token prefill chunk counts as a decode row: it is the same work.)

**Not timed:** speculative decoding (several tokens a row and a draft model: figures the model does not have),
split prefill, dLLM, prebuilt (disaggregated decode) and idle (data-parallel padding) batches. Their landing still
bounds the next pass's start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sglang.srt.model_executor.forward_batch_info import ForwardMode

from scheduler.pass_cost import chunk_ctx_pairs
from scheduler.pass_cost_fit import OnlinePassCost

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch


@dataclass(frozen=True, slots=True)
class PassFigures:
    """What one pass ran, in `PassCost.pass_s`'s terms."""

    prefill_tokens: int
    prefill_ctx_pairs: float
    decode_rows: int
    decode_ctx_tokens: int


@dataclass(frozen=True, slots=True)
class TimedPass:
    forward_pass: int
    """sglang's ``forward_iter`` of the pass (its ``forward_ct`` when launched)."""
    figures: PassFigures
    measured_s: float
    predicted_s: float
    """The model in force's prediction, made before the pass joined the fit's window."""


def pass_figures(batch: ScheduleBatch) -> PassFigures | None:
    """The figures of a generation batch the fit learns from; None for one it does not (see the module docstring)."""
    mode = batch.forward_mode
    if not batch.spec_algorithm.is_none() or batch.dllm_config is not None:
        return None
    if mode == ForwardMode.DECODE:
        seq_lens = batch.seq_lens_cpu
        ctx = int(seq_lens.sum()) if seq_lens is not None else sum(r.seqlen for r in batch.reqs)
        return PassFigures(0, 0.0, len(batch.reqs), ctx)
    if mode != ForwardMode.EXTEND and mode != ForwardMode.MIXED:
        return None
    tokens = rows = ctx = 0
    pairs = 0.0
    for prefix, extend in zip(batch.prefix_lens, batch.extend_lens, strict=True):
        if extend == 1:
            rows += 1
            ctx += prefix + 1
        else:
            tokens += extend
            pairs += chunk_ctx_pairs(prefix, extend)
    return PassFigures(tokens, pairs, rows, ctx)


class PassTimer:
    """Times passes by where their results land (the module docstring's rule) and feeds `fit`."""

    def __init__(self, fit: OnlinePassCost) -> None:
        self.fit = fit
        self.last_landed_s: float | None = None
        self.num_timed = 0

    def landed(
        self, launched_s: float | None, figures: PassFigures | None, landed_s: float, forward_pass: int
    ) -> TimedPass | None:
        """A pass launched at `launched_s` (``time.monotonic()``) had its result processed at `landed_s`; returns the
        pass as timed and predicted, or None when it is not one the fit learns from."""
        previous, self.last_landed_s = self.last_landed_s, landed_s
        if figures is None or launched_s is None:
            return None
        started_s = launched_s if previous is None else max(launched_s, previous)
        measured_s = landed_s - started_s
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
