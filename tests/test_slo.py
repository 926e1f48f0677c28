"""The one SLO definition (`scheduler.slo`): a request's verdict, attainment and goodput."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.slo import SloTargets, attainment, gap_quantile_s, meets_slo

CHAT = SloTargets(ttft_s=0.5, tbt_s=0.3)


def test_a_chat_meets_its_slo_when_its_first_token_and_its_gaps_are_within_the_targets():
    assert meets_slo(CHAT, 0.5, [0.1, 0.3, 0.2])
    assert not meets_slo(CHAT, 0.51, [0.1])
    assert not meets_slo(CHAT, None, [])  # never produced a token
    assert meets_slo(CHAT, 0.2, [])  # one token: no gap to judge


def test_one_stall_fails_a_stream_of_under_a_hundred_gaps_and_one_in_a_hundred_is_tolerated_beyond():
    assert not meets_slo(CHAT, 0.1, [0.05] * 98 + [0.31])
    assert meets_slo(CHAT, 0.1, [0.05] * 99 + [0.31])
    assert meets_slo(CHAT, 0.1, [0.05] * 198 + [0.9] * 2)  # 2 of 200 gaps over: its p99 (rank 198) is 0.05
    assert not meets_slo(CHAT, 0.1, [0.05] * 197 + [0.9] * 3)  # 3 of 200: rank 198 is over


def test_a_target_left_unset_is_not_judged():
    assert meets_slo(SloTargets(), None, [100.0])
    assert meets_slo(SloTargets(ttft_s=1.0), 0.9, [100.0])


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_targets_must_be_positive_seconds(bad):
    with pytest.raises(ValueError, match="ttft_s"):
        SloTargets(ttft_s=bad)


@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=300))
def test_the_gap_quantile_is_one_of_the_gaps_and_at_most_one_percent_lie_above_it(gaps):
    q = gap_quantile_s(gaps)
    assert q in gaps
    assert sum(g > q for g in gaps) <= 0.01 * len(gaps)


def test_attainment_and_goodput():
    att = attainment([True, True, False, True], span_s=2.0)
    assert (att.num_requests, att.num_met, att.fraction, att.goodput_per_s) == (4, 3, 0.75, 1.5)
    empty = attainment([], span_s=0.0)
    assert empty.fraction is None and empty.goodput_per_s is None
