"""How an engine's attention kernel counts a pass's attention (`scheduler.pass_cost.AttentionWork`), and the
planner predicting passes as the fit measured them: sglang's ``torch_native`` backend computes every extend row
as the causal square of its sequence, so a short chunk deep in a document costs nearly what a long one does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.pass_cost import AttentionWork, chunk_ctx_pairs, extend_pairs, riding_figures
from scheduler.pass_cost_fit import LinearPassCost, OnlinePassCost
from scheduler.planner import PassPlanner
from scheduler.snapshot import Candidate
from tests.factories import cfg, snap

QUERIES, PADDED = AttentionWork.QUERIES, AttentionWork.PADDED_CAUSAL
# Recorded on the CPU benchmark's tiny model (one core): ~3 ms a pass, ~50 us a prefilled token, ~8 ns a pair.
CPU = LinearPassCost(0.003, 5e-5, 8e-9, 1e-4, 2e-8)


class PaddedCost:
    attention = PADDED

    def pass_s(self, *figures: float) -> float:
        return CPU.pass_s(*figures)


def test_a_padded_chunk_costs_the_square_of_its_sequence():
    assert extend_pairs(QUERIES, 10_000, 1) == chunk_ctx_pairs(10_000, 1) == 10_001
    assert extend_pairs(PADDED, 10_000, 1) == 10_001 * 10_002 / 2
    assert extend_pairs(PADDED, 0, 500) == extend_pairs(QUERIES, 0, 500)  # a fresh prompt: the same either way
    assert extend_pairs(PADDED, 10_000, 0) == 0


@given(st.integers(0, 50_000), st.integers(1, 8_192))
def test_padded_attention_is_never_less_than_the_queries_own(start, tokens):
    assert extend_pairs(PADDED, start, tokens) >= extend_pairs(QUERIES, start, tokens)


def test_decoding_rows_riding_in_an_extend_pass_count_as_padded_squares():
    assert riding_figures(PADDED, True, 1, 12_000) == (chunk_ctx_pairs(0, 12_000), 0)
    assert riding_figures(PADDED, False, 1, 12_000) == (0.0, 12_000)  # a decode pass: one query a row
    assert riding_figures(QUERIES, True, 3, 12_000) == (0.0, 12_000)


def test_the_planner_predicts_a_deep_chunk_as_the_engine_computes_it():
    # A document 12,000 tokens in: under padded attention even its smallest chunk costs a pass over all of it.
    def planned(cost: object):
        planner = PassPlanner(cfg(ttft_target_s=1.0), pass_cost=cost)
        return planner.plan(snap([], continuing=[Candidate("doc", 20_000, 0, 12_000)]))

    queries, padded = planned(CPU), planned(PaddedCost())
    tokens = padded.num_prefill_tokens
    assert padded.predicted_pass_s == pytest.approx(CPU.pass_s(tokens, extend_pairs(PADDED, 12_000, tokens), 0, 0))
    assert padded.predicted_pass_s <= padded.pass_bound_s
    assert 0 < tokens < queries.num_prefill_tokens


def test_the_fit_names_the_attention_it_counts():
    assert OnlinePassCost(attention=PADDED).describe()["attention"] == "padded_causal"
