"""`benchmarks.sglang_plugin_profile`: which of the scheduler's py-spy samples are the plugin's."""

from __future__ import annotations

import pytest

from benchmarks.sglang_plugin_profile import owner, profile

LOOP = "run_scheduler_process (scheduler.py:6368);Scheduler.event_loop_overlap (scheduler.py:2109)"
HOOK = "wrapper (plugins/hook_registry.py:388);around_run_batch (scheduler/sglang_plugin/hooks.py:110)"
FORWARD = "Scheduler.run_batch (scheduler.py:4704);LlamaModel.forward (llama.py:487);linear (torch/nn/functional.py:10)"
TIMER = "pass_figures (scheduler/sglang_plugin/pass_timer.py:93)"
FIT = "refit (scheduler/pass_cost_fit.py:360);solve (numpy/linalg/_linalg.py:400)"


@pytest.mark.parametrize(
    ("frame", "who"),
    [
        ("around_run_batch (scheduler/sglang_plugin/hooks.py:110)", "own"),
        ("Scheduler.run_batch (scheduler.py:4704)", "sglang"),
        ("wrapper (plugins/hook_registry.py:388)", "sglang"),
        ("linear (torch/nn/functional.py:10)", None),
        ("solve (numpy/linalg/_linalg.py:400)", None),
        ("<module> (<string>:1)", "sglang"),
        ("_run (<frozen runpy>:88)", None),
        ("something without a location", None),
    ],
)
def test_a_frame_is_the_projects_sglangs_or_a_librarys(frame, who):
    assert owner(frame) == who


def test_a_sample_is_the_plugins_only_where_its_deepest_non_library_frame_is():
    raw = [
        f"{LOOP};{HOOK};{FORWARD} 90",  # the forward pass below the plugin's hook: sglang's
        f"{LOOP};{HOOK};{TIMER} 6",  # the plugin's own work in its hook
        f"{LOOP};{FIT} 3",  # numpy called by the plugin's fit: the plugin's
        f"{LOOP} 1",
        "",
    ]
    p = profile(raw)
    assert p.samples == 100 and p.share == pytest.approx(0.09)
    assert p.own == {TIMER: 6, "refit (scheduler/pass_cost_fit.py:360)": 3}
    assert p.ratio_bound == pytest.approx(1 / 0.91)
    assert profile([]).share == 0.0
