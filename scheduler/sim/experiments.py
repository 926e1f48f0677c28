"""Measurements shared by `reproduce`, `frontier` and `compare`: each is a run of the simulator."""

from __future__ import annotations

import statistics

from scheduler.sim.metrics import long_prefill_windows
from scheduler.sim.presets import Preset
from scheduler.sim.rules import make_scheduler
from scheduler.sim.runner import RunResult, run
from scheduler.sim.workload import Workload, doc_4sessions, doc_question
from scheduler.traffic import TrafficClass

UNCHUNKED = "baseline:chunk_budget_tokens=1000000000"
# The question lands at 16 evenly spread moments over 8 s (longer than any pass of the sweep), so the
# reported TTFT is the mean over where in the pass in flight it arrives, not one lucky sample.
QUESTION_TIMES_S = [40.0 + 0.5 * k for k in range(16)]


def run_spec(
    workload: Workload, spec: str, preset: Preset, step_clock: bool = False, progress: bool | None = False
) -> RunResult:
    return run(
        workload.requests(), preset, make_scheduler(spec, preset), policy=spec, step_clock=step_clock, progress=progress
    )


def long_tok_per_s(result: RunResult) -> float:
    tokens = sum(r.prompt_tokens - r.cached_tokens for r in result.requests if r.traffic_class is TrafficClass.LONG)
    return tokens / sum(b - a for a, b in long_prefill_windows(result.requests))


def short_ttfts(result: RunResult) -> list[float]:
    return [r.ttft_s for r in result.requests if r.traffic_class is TrafficClass.SHORT and r.ttft_s is not None]


def single_session(spec: str, preset: Preset) -> tuple[float, float]:
    """The article's single-session case: (mean short TTFT over arrival moments, mean long tok/s)."""
    ttfts, tputs = [], []
    for t in QUESTION_TIMES_S:
        result = run_spec(doc_question(question_at_s=t), spec, preset)
        ttfts += short_ttfts(result)
        tputs.append(long_tok_per_s(result))
    return statistics.fmean(ttfts), statistics.fmean(tputs)


def four_sessions_first_question_ttft(spec: str, preset: Preset) -> float:
    """The article measured one question; ours is the session's first, asked while the third document is blocked."""
    return short_ttfts(run_spec(doc_4sessions(), spec, preset))[0]


def added_waits(workload: Workload, spec: str, preset: Preset) -> tuple[RunResult, list[float]]:
    """The interference long documents cause: each short request's TTFT with the documents less its TTFT in
    the same workload without them (same requests, same arrivals). Returns the run with documents too."""
    with_docs = run_spec(workload, spec, preset)
    alone = run(workload.short_only(), preset, make_scheduler(spec, preset), policy=spec)
    reference = {r.rid: r.ttft_s for r in alone.requests if r.ttft_s is not None}
    added = [
        r.ttft_s - reference[r.rid]
        for r in with_docs.requests
        if r.traffic_class is TrafficClass.SHORT and r.ttft_s is not None and r.rid in reference
    ]
    return with_docs, added
