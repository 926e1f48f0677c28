"""Timing sglang's passes where their results land: the overlap rule, and the figures read from a batch."""

from __future__ import annotations

import random
from types import SimpleNamespace

import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from scheduler.pass_cost import AttentionWork, chunk_ctx_pairs
from scheduler.pass_cost_fit import OnlinePassCost
from scheduler.sglang_plugin.pass_timer import (
    MAX_HELD,
    DecodeLaunch,
    PassFigures,
    PassTimer,
    launch_figures,
    pass_figures,
)
from scheduler.sglang_plugin.translate import admission_lag_passes, launch_is_synchronous, output_lag_passes

NO_SPEC = SpeculativeAlgorithm.NONE
PREFILL = PassFigures(512, chunk_ctx_pairs(0, 512), 0, 0)


def batch(mode: ForwardMode, prefix_lens=(), extend_lens=(), seq_lens=None, spec=NO_SPEC, reqs=()):
    return SimpleNamespace(
        forward_mode=mode,
        spec_algorithm=spec,
        dllm_config=None,
        prefix_lens=list(prefix_lens),
        extend_lens=list(extend_lens),
        seq_lens_cpu=None if seq_lens is None else torch.tensor(seq_lens, dtype=torch.int64),
        reqs=list(reqs) or [object()] * (len(seq_lens) if seq_lens is not None else len(extend_lens)),
    )


def measured(timer: PassTimer, launched_s: float, landed_s: float, figures=PREFILL, forward_pass=0) -> float | None:
    timed = timer.landed(launched_s, figures, landed_s, forward_pass)
    return None if timed is None else round(timed.measured_s, 9)


def test_the_normal_loop_times_a_pass_from_its_launch_to_its_result():
    timer = PassTimer(OnlinePassCost())
    assert measured(timer, 10.0, 10.2) == 0.2
    assert measured(timer, 10.25, 10.35) == 0.1  # the scheduling between passes is not the pass's


def test_the_overlap_loop_times_a_pass_between_consecutive_results():
    # Overlap: pass 2 is launched (10.05) before pass 1's result lands (10.2); the device runs pass 2 after pass 1.
    timer = PassTimer(OnlinePassCost())
    assert measured(timer, 10.0, 10.2) == 0.2
    assert measured(timer, 10.05, 10.5) == 0.3
    assert measured(timer, 10.3, 10.6) == 0.1
    # After an idle gap the pass starts at its launch again.
    assert measured(timer, 20.0, 20.4) == 0.4


def test_on_a_synchronous_device_the_overlap_loop_times_each_pass_by_its_own_forward():
    # sglang's overlap loop on CPU, as recorded: run_batch runs the forward before it returns, and pass N's result
    # lands after pass N+1 has been launched and so has run. A document's chunk (0.2 s), its next chunk at a deeper
    # context (0.5 s), then a decode pass (0.01 s).
    timer = PassTimer(OnlinePassCost(), synchronous_launch=True)
    timer.run_returned(1, 10.2)  # launched 10.0
    timer.run_returned(2, 10.71)  # launched 10.21, before pass 1's result lands
    assert measured(timer, 10.0, 10.72, forward_pass=1) == 0.2
    timer.run_returned(3, 10.74)  # launched 10.73
    assert measured(timer, 10.21, 10.75, forward_pass=2) == 0.5
    assert measured(timer, 10.73, 10.76, forward_pass=3) == 0.01
    # The same landings timed where results land charge each pass the next one's forward.
    where_landed = PassTimer(OnlinePassCost())
    assert [measured(where_landed, a, b) for a, b in ((10.0, 10.72), (10.21, 10.75), (10.73, 10.76))] == [
        0.72,
        0.03,
        0.01,
    ]


def test_a_synchronous_timer_forgets_returns_whose_results_never_landed():
    timer = PassTimer(OnlinePassCost(), synchronous_launch=True)
    timer.run_returned(1, 1.1)  # its result is never processed
    timer.run_returned(2, 1.3)
    assert timer.landed(1.15, PREFILL, 1.4, forward_pass=2).measured_s == 1.3 - 1.15
    assert not timer._returned_s


def test_a_pass_the_fit_does_not_learn_from_still_bounds_the_next_one():
    fit = OnlinePassCost()
    timer = PassTimer(fit)
    assert timer.landed(10.0, None, 10.2, forward_pass=1) is None  # e.g. a speculative pass
    assert measured(timer, 10.05, 10.5) == 0.3
    assert fit.num_observed == 1 and timer.num_timed == 1


def test_every_timed_pass_feeds_the_fit_with_its_prediction():
    fit = OnlinePassCost()
    timer = PassTimer(fit)
    timed = timer.landed(1.0, PREFILL, 1.1, forward_pass=7)
    assert timed.forward_pass == 7 and timed.predicted_s == fit.prior.pass_s(512, chunk_ctx_pairs(0, 512), 0, 0)
    assert fit.num_observed == 1


def test_a_decode_batch_is_rows_and_their_sequence_lengths():
    assert pass_figures(batch(ForwardMode.DECODE, seq_lens=[101, 2001, 31])) == PassFigures(0, 0.0, 3, 2133)


def test_a_decode_launch_sums_its_contexts_as_launched_when_it_is_timed():
    decode = batch(ForwardMode.DECODE, seq_lens=[101, 2001, 31])
    launch = launch_figures(decode)
    assert isinstance(launch, DecodeLaunch) and launch.seq_lens is decode.seq_lens_cpu  # nothing summed at landing
    decode.seq_lens_cpu = decode.seq_lens_cpu + 1  # sglang's next decode step builds a new tensor
    decode.reqs.pop()  # and a request that finished leaves the batch
    assert launch.figures() == PassFigures(0, 0.0, 3, 2133)
    no_tensor = batch(ForwardMode.DECODE, reqs=[SimpleNamespace(seqlen=101), SimpleNamespace(seqlen=31)])
    assert launch_figures(no_tensor) == PassFigures(0, 0.0, 2, 132)  # request state changes: summed at once


def test_a_mixed_batch_splits_prefill_chunks_from_decode_rows():
    # sglang's mixed chunk: two prefill rows (a cached prefix of 1,000, a fresh prompt), then two decoding rows
    # appended as one-token extends after their contexts.
    figures = pass_figures(batch(ForwardMode.MIXED, prefix_lens=[1000, 0, 499, 99], extend_lens=[256, 30, 1, 1]))
    assert figures == PassFigures(286, chunk_ctx_pairs(1000, 256) + chunk_ctx_pairs(0, 30), 2, 600)


def test_under_padded_attention_a_one_token_extend_row_costs_the_square_of_its_sequence():
    # sglang's torch_native backend: a document's one-token chunk 9,413 tokens in, a chat's prompt, a chat decoding.
    mixed = batch(ForwardMode.MIXED, prefix_lens=[9413, 0, 60], extend_lens=[1, 60, 1])
    figures = pass_figures(mixed, AttentionWork.PADDED_CAUSAL)
    assert figures == PassFigures(60, chunk_ctx_pairs(0, 9414) + chunk_ctx_pairs(0, 60) + chunk_ctx_pairs(0, 61), 2, 0)
    assert pass_figures(mixed).prefill_ctx_pairs == chunk_ctx_pairs(0, 60)  # queries only: the rows' contexts instead
    decode = batch(ForwardMode.DECODE, seq_lens=[9414, 61])
    assert pass_figures(decode, AttentionWork.PADDED_CAUSAL) == PassFigures(0, 0.0, 2, 9475)


def test_passes_the_model_has_no_figures_for_are_not_timed():
    speculative = batch(ForwardMode.DECODE, seq_lens=[10], spec=SpeculativeAlgorithm.EAGLE)
    assert pass_figures(speculative) is None
    assert pass_figures(batch(ForwardMode.IDLE)) is None
    assert pass_figures(batch(ForwardMode.TARGET_VERIFY, prefix_lens=[10], extend_lens=[4])) is None


def test_the_overlap_loop_on_a_synchronous_device_sends_first_tokens_a_pass_late_and_admits_without_lag():
    # It processes a pass's results after launching the next pass; on CPU the launch runs that pass, and the loop
    # reads the requests that arrived meanwhile before it plans the next one. On a GPU it plans the next pass while
    # the one in flight runs.
    def sched(device: str, overlap: bool) -> SimpleNamespace:
        return SimpleNamespace(device=device, enable_overlap=overlap)

    assert launch_is_synchronous(sched("cpu", True)) and not launch_is_synchronous(sched("cuda", True))
    lags = {
        (d, o): (admission_lag_passes(sched(d, o)), output_lag_passes(sched(d, o)))
        for d in ("cpu", "cuda")
        for o in (True, False)
    }
    assert lags == {("cpu", True): (0, 1), ("cuda", True): (1, 0), ("cpu", False): (0, 0), ("cuda", False): (0, 0)}


def timed_stream(timer: PassTimer, later: bool, passes: int, seed: int) -> None:
    """`passes` passes of a stream under the synchronous overlap loop: a document's chunks, then decode-only
    passes (as the hook reads them: their contexts summed when timed), each landing after the next one's launch
    returned."""
    rng = random.Random(seed)
    now = 10.0
    for n in range(passes):
        prefill = PassFigures(256, chunk_ctx_pairs(256 * n, 256), 0, 0)
        figures = prefill if n < 12 else launch_figures(batch(ForwardMode.DECODE, seq_lens=[3000 + n, n]))
        launched, now = now, now + rng.uniform(0.002, 0.3 if n < 12 else 0.004)
        timer.run_returned(n, now)
        land = timer.landed_later if later else timer.landed
        land(launched, figures, now + 0.0001, n)


def test_passes_held_for_later_feed_the_fit_as_passes_fed_at_once_would():
    at_once, later = PassTimer(OnlinePassCost(), synchronous_launch=True), PassTimer(OnlinePassCost(), True)
    timed_stream(at_once, later=False, passes=MAX_HELD - 1, seed=5)
    timed_stream(later, later=True, passes=MAX_HELD - 1, seed=5)
    assert later.fit.num_observed == 0 and later.num_timed == 0  # held: nothing read the fit yet
    assert later.last_ended_s is None and len(later._returned_s) == MAX_HELD - 1  # nor timed: a list append a pass
    later.catch_up()
    assert later.fit.num_observed == at_once.fit.num_observed == MAX_HELD - 1
    assert later.fit.model == at_once.fit.model and later.fit.num_fits == at_once.fit.num_fits > 0
    assert later.fit.describe() == at_once.fit.describe() and later.num_timed == at_once.num_timed


def test_a_timer_holds_at_most_max_held_passes_and_a_landing_fed_at_once_feeds_the_held_ones_first():
    timer, reference = PassTimer(OnlinePassCost(), True), PassTimer(OnlinePassCost(), True)
    timed_stream(timer, later=True, passes=MAX_HELD + 5, seed=6)
    assert timer.fit.num_observed == MAX_HELD  # fed at the last one it may hold, then 5 held again
    timed_stream(reference, later=False, passes=MAX_HELD + 5, seed=6)
    timer.run_returned(MAX_HELD + 5, 50.0)
    reference.run_returned(MAX_HELD + 5, 50.0)
    assert timer.landed(49.9, PREFILL, 50.1, MAX_HELD + 5) == reference.landed(49.9, PREFILL, 50.1, MAX_HELD + 5)
    assert timer.fit.describe() == reference.fit.describe()


def test_the_policy_feeds_the_fit_before_anything_reads_it():
    from scheduler.planner import PassPlanner
    from scheduler.sglang_plugin.attach import SchedulerPolicy

    fit = OnlinePassCost()
    policy = SchedulerPolicy(PassPlanner(pass_cost=fit), pass_cost=fit, timer=PassTimer(fit))
    for n in range(20):
        policy.pass_landed(10.0 + n, PassFigures(0, 0.0, 1, 3000 + n), 10.003 + n, n)
    assert fit.num_observed == 0  # no trace, no diagnostics: held
    state = policy.describe()
    assert fit.num_observed == 20 and state["timed_passes"] == 20 and state["pass_cost"]["observed_passes"] == 20


def test_on_a_synchronous_device_the_loops_time_between_prefill_passes_is_the_fits_loop_overhead():
    fit = OnlinePassCost()
    timer = PassTimer(fit, synchronous_launch=True)
    decode = PassFigures(0, 0.0, 2, 100)
    # A document's chunks back to back: each launched 4-6 ms after the last one's forward returned.
    launched = 10.0
    for i, gap_s in enumerate((0.005, 0.004, 0.006)):
        timer.run_returned(i, launched + 0.04)
        timer.landed(launched, PREFILL, launched + 0.041, forward_pass=i)
        launched += 0.04 + gap_s
    assert round(fit.loop_overhead_s, 9) == 0.0045  # the median of the two gaps between them so far
    # A wait for work (over 50 ms) is not the loop's work; nor is the gap before or after a decode-only pass.
    timer.run_returned(3, launched + 0.04)
    timer.landed(launched, PREFILL, launched + 0.041, forward_pass=3)
    timer.run_returned(4, launched + 1.0 + 0.01)
    timer.landed(launched + 1.0, decode, launched + 1.011, forward_pass=4)
    timer.run_returned(5, launched + 1.02 + 0.04)
    timer.landed(launched + 1.02, PREFILL, launched + 1.061, forward_pass=5)
    timer.run_returned(6, launched + 1.2 + 0.04)
    timer.landed(launched + 1.2, PREFILL, launched + 1.241, forward_pass=6)
    assert round(fit.loop_overhead_s, 9) == 0.005  # the gaps 5, 4, 6 ms: the idle 140 ms left out
    assert fit.describe()["loop_overhead_s"] == fit.loop_overhead_s
    # Where passes are timed result to result (the overlap loop on a GPU), the loop's work is in them already.
    gpu_fit = OnlinePassCost()
    gpu = PassTimer(gpu_fit)
    gpu.landed(10.0, PREFILL, 10.04, forward_pass=1)
    gpu.landed(10.045, PREFILL, 10.085, forward_pass=2)
    assert gpu_fit.loop_overhead_s == 0.0
