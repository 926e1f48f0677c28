"""The paired on/off benchmark's figures (`benchmarks/sglang_plugin_pairs.py`): the median of the pairs' ratios
with a bootstrap interval, and the verdict on "at most 1.02x", met or missed only where the whole interval says so."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.sglang_plugin_pairs import TARGET_RATIO, median_interval, verdict

RATIOS = st.lists(st.floats(0.5, 1.5), min_size=4, max_size=20)


def test_tight_pairs_are_judged_on_their_side_of_the_target():
    assert verdict(*median_interval([1.004, 1.006, 1.005, 1.003, 1.007])[1:]) == "met"
    assert verdict(*median_interval([1.06, 1.05, 1.07, 1.055, 1.065])[1:]) == "missed"


def test_pairs_spread_around_the_target_are_unresolved():
    _, low, high = median_interval([0.90, 1.15, 0.95, 1.10, 1.02, 0.98, 1.05])
    assert low < TARGET_RATIO < high
    assert verdict(low, high) == "unresolved"


@given(RATIOS)
def test_the_interval_holds_the_median_within_the_pairs(ratios):
    mid, low, high = median_interval(ratios)
    assert min(ratios) <= low <= high <= max(ratios)
    assert min(ratios) <= mid <= max(ratios)
