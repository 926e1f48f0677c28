"""The paired on/off benchmark's figures (`benchmarks/sglang_plugin_pairs.py`): the median of the pairs' ratios
with a bootstrap interval over rounds (servers started afresh), and the verdict on "at most 1.02x", met or missed
only where the whole interval says so."""

from __future__ import annotations

import contextlib
import io

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.sglang_plugin_pairs import (
    PLUGIN_SIDES,
    TARGET_RATIO,
    UPSTREAM_BOTH_SIDES,
    Run,
    median_interval,
    report,
    verdict,
)

RATIOS = st.lists(st.floats(0.5, 1.5), min_size=4, max_size=20)
ROUNDS = st.lists(RATIOS, min_size=1, max_size=6)


def test_tight_pairs_are_judged_on_their_side_of_the_target():
    assert verdict(*median_interval([[1.004, 1.006], [1.005, 1.003, 1.007]])[1:]) == "met"
    assert verdict(*median_interval([[1.06, 1.05], [1.07, 1.055, 1.065]])[1:]) == "missed"


def test_pairs_spread_around_the_target_are_unresolved():
    _, low, high = median_interval([[0.90, 1.15, 0.95, 1.10, 1.02, 0.98, 1.05]])
    assert low < TARGET_RATIO < high
    assert verdict(low, high) == "unresolved"


def test_servers_that_differ_widen_the_interval_that_their_pairs_alone_would_give():
    """Four starts of the servers, each consistent within itself (0.99x to 1.04x): the pairs resampled one by one
    keep the median's interval inside the middle starts; resampled by round, it reaches the outer ones."""
    rounds = [[start + d for d in (-0.001, 0.0, 0.001, 0.0005)] for start in (0.99, 1.00, 1.03, 1.04)]
    _, low_pairs, high_pairs = median_interval([[v for r in rounds for v in r]])
    _, low, high = median_interval(rounds)
    assert low_pairs > 0.998 and high_pairs < 1.032
    assert low < 0.996 and high > 1.034


@given(ROUNDS)
def test_the_interval_holds_the_median_within_the_pairs(rounds):
    ratios = [v for r in rounds for v in r]
    mid, low, high = median_interval(rounds)
    assert min(ratios) <= low <= high <= max(ratios)
    assert min(ratios) <= mid <= max(ratios)


def fake_rounds() -> list[list[dict[str, Run]]]:
    run = Run(ms_per_token=4.0, cpu_us_per_iteration=3400.0, question_ttft_s=0.02)
    slower = Run(ms_per_token=4.1, cpu_us_per_iteration=3500.0, question_ttft_s=2.5)
    return [[{"on": run, "off": slower}] * 2, [{"on": slower, "off": run}] * 2]


def printed_report(sides) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        report(fake_rounds(), sides)
    return out.getvalue()


def test_the_report_names_the_plugins_sides_and_judges_the_skip():
    text = printed_report(PLUGIN_SIDES)
    assert "ms/token on" in text and "on/off, median of pairs" in text and "question TTFT,  plugin on" in text
    assert "skips ahead with the plugin on" in text and text.rstrip().endswith("False")  # one pair's question waited


def test_an_aa_check_names_no_plugin_and_judges_no_skip():
    text = printed_report(UPSTREAM_BOTH_SIDES)
    assert "ms/token A" in text and "A/B, median of pairs" in text and "question TTFT, upstream B" in text
    assert "plugin" not in text and "skips ahead" not in text
