"""The plugin-cost benchmark's figures (`benchmarks/sglang_plugin_cost.py`): the verdict on the throughput target,
met or missed only where the bootstrap interval of the on/off ratio lies wholly on one side of 98%; what the
plugin adds per iteration, from the clocked calls."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.sglang_plugin_cost import TARGET_RATIO, Mode, added_per_iteration, ratio_interval, verdict
from scheduler.sglang_plugin.clock import ClockPass, PassKind

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


def clocked(name: str, call_us: list[float], kind: PassKind, cpu_us: list[float] | None = None) -> Mode:
    mode = Mode(name, server=None, clock=None, cpu_us={"rejected": cpu_us or []})
    mode.passes["rejected"] = [ClockPass(0, int(us * 1e3), kind) for us in call_us]
    return mode


def test_the_plugin_adds_its_calls_over_upstreams_as_medians_and_as_means():
    # A call of 500 us (a catch-up of the fit, or a preemption): not the median, but in the mean.
    plugin = clocked("clocked", [20.0, 24.0, 500.0], PassKind.IDLE)
    upstream = clocked("off-clocked", [2.0, 3.0, 4.0, 90.0], PassKind.NONE)
    off = clocked("off", [], PassKind.NONE, cpu_us=[2400.0, 2500.0, 2600.0])
    median_us, mean_us, upstream_us = added_per_iteration(plugin, upstream, off, "rejected")
    assert median_us == 24.0 - 3.5
    assert abs(mean_us - (544.0 / 3 - 99.0 / 4)) < 1e-9
    assert upstream_us == 2500.0
    assert added_per_iteration(plugin, clocked("off-clocked", [], PassKind.NONE), off, "rejected") is None
    older_clock = clocked("before", [], PassKind.NONE)
    older_clock.passes["rejected"] = [ClockPass(18_000, None, None)]
    assert added_per_iteration(older_clock, upstream, off, "rejected") is None
