"""Timing sglang's passes where their results land: the overlap rule, and the figures read from a batch."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from scheduler.pass_cost import chunk_ctx_pairs
from scheduler.pass_cost_fit import OnlinePassCost
from scheduler.sglang_plugin.pass_timer import PassFigures, PassTimer, pass_figures

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


def measured(timer: PassTimer, launched_s: float, landed_s: float, figures=PREFILL) -> float | None:
    timed = timer.landed(launched_s, figures, landed_s, forward_pass=0)
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


def test_a_mixed_batch_splits_prefill_chunks_from_decode_rows():
    # sglang's mixed chunk: two prefill rows (a cached prefix of 1,000, a fresh prompt), then two decoding rows
    # appended as one-token extends after their contexts.
    figures = pass_figures(batch(ForwardMode.MIXED, prefix_lens=[1000, 0, 499, 99], extend_lens=[256, 30, 1, 1]))
    assert figures == PassFigures(286, chunk_ctx_pairs(1000, 256) + chunk_ctx_pairs(0, 30), 2, 600)


def test_passes_the_model_has_no_figures_for_are_not_timed():
    speculative = batch(ForwardMode.DECODE, seq_lens=[10], spec=SpeculativeAlgorithm.EAGLE)
    assert pass_figures(speculative) is None
    assert pass_figures(batch(ForwardMode.IDLE)) is None
    assert pass_figures(batch(ForwardMode.TARGET_VERIFY, prefix_lens=[10], extend_lens=[4])) is None
