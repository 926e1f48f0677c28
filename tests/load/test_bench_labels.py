"""The bench says what served its figures: a sim preset, or real sglang on the CPU (CPU figures)."""

from __future__ import annotations

from pathlib import Path

import yaml

from harness import local_serve as sc
from loadtests.app import load_config
from loadtests.bench import engine_label, parse_args

REPO = Path(__file__).resolve().parents[2]


def test_sim_config_is_labelled_with_its_preset_and_time_scale() -> None:
    args, _ = parse_args(["--config", str(REPO / "config.yaml"), "--time-scale", "0.5"])
    assert engine_label(args) == "sim preset card12gb-27b, time scale 0.5"


def test_sglang_on_cpu_is_labelled_as_cpu_figures() -> None:
    args, _ = parse_args(["--config", str(REPO / "config.sglang-cpu.yaml")])
    label = engine_label(args)
    assert "real sglang" in label and "CPU figures" in label and "/tmp/fairshare-tiny-llama" in label
    assert args.time_scale == 1.0  # a real engine has no clock to scale


def test_sglang_on_gpu_is_not_labelled_as_cpu() -> None:
    args, _ = parse_args(["--config", str(REPO / "config.gpu.yaml")])
    assert "CPU" not in engine_label(args)


def test_a_benchmarks_policy_is_applied_over_the_config_files() -> None:
    """The file's policy is the deployment's (its delivery margin); a benchmark's override changes what it names."""

    def policy(overrides: dict) -> dict:
        return sc.deployment(load_config(REPO / "config.yaml", 8123, overrides), "Engine")["user_config"]["policy"]

    shipped = sc.deployment(yaml.safe_load((REPO / "config.yaml").read_text()), "Engine")["user_config"]["policy"]
    margin = shipped["delivery_margin_s"]
    assert policy({}) == {"delivery_margin_s": margin}
    assert policy({"policy": {"ttft_target_s": 1.0}}) == {"delivery_margin_s": margin, "ttft_target_s": 1.0}
    assert policy({"policy": {"delivery_margin_s": 0.0}}) == {"delivery_margin_s": 0.0}
