"""The plugin-cost benchmark's verdict on the throughput target (`benchmarks/sglang_plugin_cost.py`): met or missed
only where the bootstrap interval of the on/off ratio lies wholly on one side of 98%."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.sglang_plugin_cost import TARGET_RATIO, ratio_interval, verdict

RATES = st.lists(st.floats(100.0, 1000.0), min_size=5, max_size=15)


def test_a_steady_ratio_is_judged_on_its_side_of_the_target():
    off = [400.0, 402.0, 398.0, 401.0, 399.0]
    assert verdict(*ratio_interval([r * 0.995 for r in off], off)) == "met"
    assert verdict(*ratio_interval([r * 0.95 for r in off], off)) == "missed"


def test_noisy_runs_around_the_target_are_unresolved():
    off = [400.0, 440.0, 370.0, 420.0, 380.0]
    on = [r * TARGET_RATIO for r in reversed(off)]
    low, high = ratio_interval(on, off)
    assert low < TARGET_RATIO < high
    assert verdict(low, high) == "unresolved"


@given(RATES, RATES)
def test_the_interval_brackets_the_resampled_ratios_and_scales_with_the_rates(on, off):
    low, high = ratio_interval(on, off)
    assert min(on) / max(off) <= low <= high <= max(on) / min(off)
    scaled_low, scaled_high = ratio_interval([r * 2 for r in on], off)
    assert abs(scaled_low - 2 * low) <= 1e-9 * low and abs(scaled_high - 2 * high) <= 1e-9 * high
