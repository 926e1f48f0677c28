"""The autoscaling benchmark's pure pieces (`benchmarks.autoscale_ramp`): the up-and-down shape's stages, the
autoscaled config, replica-seconds, goodput and the acceptance arithmetic. No Ray, no Locust in this process."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from benchmarks import autoscale_ramp as ar
from harness import local_serve as sc
from loadtests import app as appmod
from loadtests.recording import Sample
from loadtests.settings import LoadSettings
from loadtests.shapes.up_down_stages import LOW_HEAD_STEPS, LOW_TAIL_STEPS, PEAK_STEPS, up_down_levels, up_down_stages
from scheduler.slo import SloTargets
from serve_app.config.kuberay import OVERLAYS

REPO = Path(__file__).resolve().parents[1]
SLO = SloTargets(ttft_s=0.5, tbt_s=0.3)


# -- the shape ------------------------------------------------------------------------------------------------------


def settings(step_users: int = 8, max_users: int = 32, step_s: float = 20.0) -> LoadSettings:
    return LoadSettings(ramp_step_users=step_users, ramp_max_users=max_users, ramp_step_s=step_s)


def test_the_levels_go_low_up_plateau_down_low() -> None:
    levels = up_down_levels(settings())
    assert levels == [8] * LOW_HEAD_STEPS + [16, 24] + [32] * PEAK_STEPS + [24, 16] + [8] * LOW_TAIL_STEPS


def test_a_stage_is_a_run_of_equal_levels_labelled_by_its_phase() -> None:
    stages = up_down_stages(settings())
    assert [(s.until_s, s.users) for s in stages] == [
        (40, 8),
        (60, 16),
        (80, 24),
        (140, 32),
        (160, 24),
        (180, 16),
        (240, 8),
    ]
    assert [s.label.split(", ")[1] for s in stages] == ["low", "up", "up", "plateau", "down", "down", "low again"]


def test_a_peak_between_steps_is_reached_and_left_the_same_way() -> None:
    assert up_down_levels(settings(step_users=8, max_users=30)) == [8, 8, 16, 24, 30, 30, 30, 24, 16, 8, 8, 8]


def test_a_peak_at_the_low_level_is_one_steady_stage() -> None:
    stages = up_down_stages(settings(step_users=4, max_users=4, step_s=10))
    steps = LOW_HEAD_STEPS + PEAK_STEPS + LOW_TAIL_STEPS
    assert [(s.until_s, s.users, s.label) for s in stages] == [(10.0 * steps, 4, "4 users, plateau")]


SHAPE_PROBE = r"""
import json
from loadtests.settings import LoadSettings
from loadtests.shapes.up_down import UpDownShape

class Env:
    loadtest_settings = LoadSettings(time_scale=0.5, ramp_step_users=2, ramp_max_users=6, ramp_step_s=10)

class Runner:
    environment = Env()

shape = UpDownShape()
shape.runner = Runner()
out = []
for t in [0, 9.9, 10, 14.9, 15, 29.9, 30, 44.9, 50]:
    shape.get_run_time = lambda t=t: t
    out.append(shape.tick())
print(json.dumps(out))
"""


def test_the_locust_shape_ticks_through_the_stages_in_engine_time() -> None:
    # In a subprocess: importing Locust monkey-patches the process with gevent (tests/load/test_shapes.py).
    proc = subprocess.run([sys.executable, "-c", SHAPE_PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # Time scale 0.5: engine time = wall time * 2; levels 2,2,4,6,6,6,4,2,2,2 of 10 engine s each.
    assert [t and t[0] for t in got] == [2, 2, 4, 4, 6, 6, 4, 2, None]


# -- the app under each policy -------------------------------------------------------------------------------------


def autoscaled(policy: str) -> dict[str, Any]:
    cfg = appmod.load_config(REPO / "config.yaml", 8123, {})
    ar.autoscale(cfg, policy, ar.scaling(60.0))
    return cfg


def test_both_policies_scale_the_engine_as_the_overlay_ships_but_for_the_downscale_delay() -> None:
    shipped = OVERLAYS[ar.OVERLAY].scaling
    for policy in ar.POLICIES:
        cfg = autoscaled(policy)
        engine = sc.deployment(cfg, ar.ENGINE)
        assert "num_replicas" not in engine
        got = dict(engine["autoscaling_config"])
        got.pop("policy", None)
        got.pop("target_ongoing_requests", None)  # the request-count policy's only
        assert got == {
            "min_replicas": 1,
            "initial_replicas": 1,
            "max_replicas": 4,
            "upscale_delay_s": shipped.upscale_delay_s,
            "downscale_delay_s": 60.0,
        }
        assert cfg["http_options"]["host"] == "127.0.0.1"
        # Only the Engine is scaled: the other deployments are the laptop file's.
        laptop = yaml.safe_load((REPO / "config.yaml").read_text())
        others = [d for d in cfg["applications"][0]["deployments"] if d["name"] != ar.ENGINE]
        assert others == [d for d in laptop["applications"][0]["deployments"] if d["name"] != ar.ENGINE]


def test_only_the_slo_run_names_a_policy_function() -> None:
    assert "policy" not in sc.deployment(autoscaled("requests"), ar.ENGINE)["autoscaling_config"]
    slo = sc.deployment(autoscaled("slo"), ar.ENGINE)["autoscaling_config"]["policy"]
    assert slo == {"policy_function": "serve_app.autoscaling.serve_policy:slo_autoscaling_policy", "policy_kwargs": {}}


def test_the_policies_alternate_their_order_from_seed_to_seed() -> None:
    assert [ar.run_order(["requests", "slo"], seed) for seed in range(3)] == [
        ["requests", "slo"],
        ["slo", "requests"],
        ["requests", "slo"],
    ]


def test_quick_is_one_short_seed_and_seeds_override_the_scale() -> None:
    assert ar.parse_args(["--quick"]).scale.seeds == 1
    default = ar.parse_args([]).scale
    assert default.seeds == 3 and ar.parse_args(["--seeds", "2"]).scale == ar.Scale(
        2, *list(vars(default).values())[1:]
    )
    quick_s = up_down_stages(LoadSettings.model_validate(ar.load_values(ar.SCALES["quick"], 0)))[-1].until_s
    default_s = up_down_stages(LoadSettings.model_validate(ar.load_values(ar.SCALES["default"], 0)))[-1].until_s
    assert quick_s < default_s <= 300  # six default runs and their start-ups within about half an hour
    with pytest.raises(SystemExit):
        ar.parse_args(["--policies", "requests,magic"])


# -- replicas over time --------------------------------------------------------------------------------------------


def test_replica_seconds_hold_each_poll_until_the_next() -> None:
    polls = [(0.0, 1), (10.0, 2), (15.0, 4), (20.0, 1)]
    assert ar.replica_seconds(polls, 0.0, 30.0) == pytest.approx(10 * 1 + 5 * 2 + 5 * 4 + 10 * 1)


def test_replica_seconds_are_clipped_to_the_window() -> None:
    polls = [(-5.0, 3), (10.0, 2), (40.0, 1)]
    assert ar.replica_seconds(polls, 0.0, 30.0) == pytest.approx(10 * 3 + 20 * 2)
    assert ar.replica_seconds(polls, 12.0, 14.0) == pytest.approx(2 * 2)


def test_before_the_first_poll_its_count_holds_and_no_poll_is_no_replica() -> None:
    assert ar.replica_seconds([(2.0, 1), (4.0, 3)], 0.0, 6.0) == pytest.approx(2 * 1 + 2 * 1 + 2 * 3)
    assert ar.replica_seconds([], 0.0, 6.0) == 0.0
    assert ar.replica_seconds([(0.0, 2)], 5.0, 5.0) == 0.0


def test_replica_changes_are_when_the_count_moved_in_the_window() -> None:
    polls = [(-1.5, 1), (-0.5, 1), (0.5, 1), (10.0, 2), (11.0, 2), (20.0, 3), (35.0, 1), (50.0, 4)]
    assert ar.replica_changes(polls, 0.0, 40.0) == [(0.0, 1), (10.0, 2), (20.0, 3), (35.0, 1)]
    assert ar.replica_changes(polls[2:], 0.0, 40.0) == [(0.5, 1), (10.0, 2), (20.0, 3), (35.0, 1)]
    assert ar.replica_changes([], 0.0, 40.0) == []


def test_the_poller_reads_until_stopped_and_a_failed_read_is_skipped() -> None:
    reads: Iterator[int | Exception] = iter([1, 2, RuntimeError("controller busy"), 3])
    done = threading.Event()

    def count() -> int:
        value = next(reads, None)
        if value is None:
            done.set()
            return 3
        if isinstance(value, Exception):
            raise value
        return value

    with ar.ReplicaPoller(count, period_s=0.001) as poller:
        assert done.wait(5)
    counts = [n for _, n in poller.polls]
    assert counts[:3] == [1, 2, 3] and set(counts[3:]) <= {3}
    times = [t for t, _ in poller.polls]
    assert times == sorted(times)


# -- figures and verdicts ------------------------------------------------------------------------------------------


def sample(
    cls: str, sent_at_s: float, ttft_s: float | None = 0.1, itl_s: list[float] | None = None, **kw: Any
) -> Sample:
    return Sample(
        user="chat" if cls == "short" else "doc",
        intent=cls,
        traffic_class=cls,
        status=kw.pop("status", 200),
        sent_at_s=sent_at_s,
        ttft_s=ttft_s,
        e2e_s=(ttft_s or 0.0) + 0.5,
        itl_s=itl_s or [0.02, 0.02],
        prompt_tokens=kw.pop("prompt_tokens", 40),
        **kw,
    )


def test_a_request_meets_its_class_slo_documents_by_being_answered() -> None:
    assert ar.meets_class_slo(sample("short", 0, ttft_s=0.4), SLO)
    assert not ar.meets_class_slo(sample("short", 0, ttft_s=0.6), SLO)
    assert not ar.meets_class_slo(sample("short", 0, itl_s=[0.02, 0.5]), SLO)
    assert ar.meets_class_slo(sample("long", 0, ttft_s=30.0, itl_s=[0.5]), SLO)  # not judged on latency
    assert not ar.meets_class_slo(sample("long", 0, status=500, error="HTTP 500"), SLO)
    assert not ar.meets_class_slo(sample("short", 0, shed=True, status=429), SLO)


def test_miss_reasons_judge_ttft_first() -> None:
    assert ar.miss_reason(sample("short", 0), SLO) is None
    assert ar.miss_reason(sample("short", 0, ttft_s=0.9, itl_s=[0.9]), SLO) == "ttft"
    assert ar.miss_reason(sample("short", 0, itl_s=[0.9]), SLO) == "tbt"
    assert ar.miss_reason(sample("short", 0, ttft_s=None, status=503, shed=True), SLO) == "failed"


def run_result(polls: list[tuple[float, int]], samples: list[Sample], span_s: float = 100.0) -> ar.RunResult:
    return ar.RunResult("requests", 0, SLO, samples, polls, span_s)


def test_figures_of_a_run() -> None:
    samples = [
        sample("short", 1.0),
        sample("short", 2.0, ttft_s=0.9),  # missed TTFT
        sample("short", 3.0),
        sample("short", 4.0, status=429, shed=True),  # shed: missed
        sample("long", 5.0, ttft_s=2.0, prompt_tokens=20_000, cached_tokens=0),
        sample("short", 150.0),  # after the shape: not in the goodput window
    ]
    f = ar.figures_of(run_result([(0.0, 1), (50.0, 2), (120.0, 4)], samples))
    assert f.chat_attainment == pytest.approx(3 / 5)
    assert f.chat_requests == 5
    assert f.doc_tok_per_s == pytest.approx(20_000 / 2.0)
    assert f.replica_s == pytest.approx(50 * 1 + 50 * 2)
    assert f.goodput_per_s == pytest.approx(3 / 100)  # two chats and the document, in 100 s
    assert f.good_per_replica_hour == pytest.approx(3 / (150 / 3600))
    assert f.max_replicas == 2  # the 4 came after the shape


def test_mean_figures_are_per_seed_means() -> None:
    a = ar.figures_of(run_result([(0.0, 1)], [sample("short", 1.0)]))
    b = ar.figures_of(run_result([(0.0, 3)], [sample("short", 1.0, ttft_s=0.9)]))
    m = ar.mean_figures([a, b])
    assert m["replica_s"] == pytest.approx(200.0)
    assert m["chat_attainment"] == pytest.approx(0.5)
    assert m["good_per_replica_hour"] == pytest.approx((36.0 + 0.0) / 2)
    assert ar.mean_figures([]) == dict.fromkeys(ar.FIELDS)


def means(attainment: float, replica_s: float, good_per_replica_hour: float) -> dict[str, float | None]:
    return {
        "chat_attainment": attainment,
        "doc_tok_per_s": 1000.0,
        "replica_s": replica_s,
        "goodput_per_s": 1.0,
        "good_per_replica_hour": good_per_replica_hour,
    }


def test_fewer_replica_seconds_at_equal_attainment_pass() -> None:
    v = ar.verdicts(means(0.99, 1000, 100), means(0.99, 800, 120))
    assert v.attainment_met and v.fewer_replicas and not v.more_goodput and v.passed
    assert v.replica_s_ratio == pytest.approx(0.8) and v.goodput_ratio == pytest.approx(1.2)


def test_fewer_replica_seconds_at_worse_attainment_do_not_count() -> None:
    v = ar.verdicts(means(0.999, 1000, 100), means(0.995, 500, 140))
    assert v.attainment_met and not v.attainment_not_worse and not v.fewer_replicas and not v.passed


def test_much_more_goodput_per_replica_passes_alone() -> None:
    v = ar.verdicts(means(0.999, 1000, 100), means(0.995, 900, 150))
    assert v.more_goodput and not v.fewer_replicas and v.passed


def test_attainment_below_target_fails_whatever_else() -> None:
    v = ar.verdicts(means(0.90, 1000, 100), means(0.98, 500, 300))
    assert not v.attainment_met and v.fewer_replicas and v.more_goodput and not v.passed


def test_missing_figures_fail_without_dividing_by_zero() -> None:
    empty = dict.fromkeys(ar.FIELDS)
    v = ar.verdicts(empty, empty)
    assert not v.passed and v.replica_s_ratio is None and v.goodput_ratio is None
    assert ar.verdicts(means(0.99, 0, 0), means(0.995, 10, 10)).replica_s_ratio is None


def test_stage_views_count_replicas_and_misses_per_stage() -> None:
    stages = up_down_stages(settings(step_users=2, max_users=4, step_s=10))  # 2 to 20 s, 4 to 50 s, 2 to 80 s
    runs = [
        run_result([(0.0, 1), (30.0, 3)], [sample("short", 5.0), sample("short", 25.0, ttft_s=0.9)], span_s=80.0),
        run_result([(0.0, 1)], [sample("short", 45.0, itl_s=[0.9]), sample("long", 46.0)], span_s=80.0),
    ]
    views = ar.stage_views(runs, stages)
    assert [v.label for v in views] == [s.label for s in stages]
    assert [v.mean_replicas for v in views] == pytest.approx([1.0, (1.0 * 10 + 3.0 * 20 + 30) / 30 / 2, 2.0])
    assert [v.chats for v in views] == [1, 2, 0]
    assert [v.missed for v in views] == [{}, {"ttft": 1, "tbt": 1}, {}]


def test_the_report_prints_both_policies_and_the_verdicts_and_the_plot_is_drawn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stages = up_down_stages(settings(step_users=2, max_users=4, step_s=10))
    chats = [sample("short", float(t)) for t in range(0, 80, 4)]
    by_policy = {
        "requests": [run_result([(0.0, 1), (30.0, 3)], chats, span_s=80.0)],
        "slo": [ar.RunResult("slo", 0, SLO, chats, [(0.0, 1), (20.0, 2)], 80.0)],
    }
    ar.report(Console(width=200), by_policy, stages)
    out = capsys.readouterr().out
    assert "requests: mean over 1 seed(s)" in out and "slo: mean over 1 seed(s)" in out
    assert "seed 0, RUNNING replicas: 1 at 0 s, 3 at 30 s" in out
    assert "[PASS] slo chat SLO attainment 100.00% >= 99%" in out
    assert "replica-seconds 0.778x" in out  # 140 / 180 and "acceptance: PASS" in out
    ar.plot(by_policy, stages, tmp_path / "replicas.png")
    assert (tmp_path / "replicas.png").stat().st_size > 0
