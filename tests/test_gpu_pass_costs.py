"""`benchmarks.gpu_pass_costs`: its fit recovers a known cost model, its pass figures are the simulator's, and the
script measures a tiny model on CPU without the project's dependencies (as it must on the GPU machine), then fits
and reports it. The CPU timings mean nothing; the figures come from `--fit-only` on a GPU run's measurements."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.gpu_pass_costs import (
    FIGURES,
    FULL_GRID,
    SPLIT_FIGURES,
    TINY_GRID,
    fit_cost,
    fit_split_cost,
    main,
    pass_shapes,
)
from harness.results import REPO
from scheduler.pass_cost import chunk_ctx_pairs
from scheduler.pass_cost_fit import LinearPassCost
from scheduler.sim.cost_model import CostModel
from scheduler.sim.presets import H100_8B

KNOWN = CostModel(
    name="known",
    fixed_s=0.0071,
    prefill_tok_per_s=41_000.0,
    decode_row_s=3.3e-5,
    attn_s_per_token_ctx=9.5e-10,
    kv_pool_tokens=1,
)
# Decode attention reads the KV cache, prefill attention multiplies: per token, they cost apart.
KNOWN_SPLIT = LinearPassCost(
    fixed_s=0.0045, prefill_token_s=2.4e-5, prefill_pair_s=1.3e-9, decode_row_s=2e-5, decode_ctx_token_s=2.7e-8
)
FITTED = ("fixed_s", "prefill_tok_per_s", "decode_row_s", "attn_s_per_token_ctx")

# Runs the measuring step with pydantic unimportable: the GPU machine has torch, numpy and scipy, not the project.
WITHOUT_PYDANTIC = (
    "import runpy, sys; sys.modules['pydantic'] = None; "
    "runpy.run_module('benchmarks.gpu_pass_costs', run_name='__main__', alter_sys=True)"
)


def synthetic(cost: CostModel | LinearPassCost) -> list[dict[str, float]]:
    return [{**s.figures(), "median_s": cost.pass_s(**s.figures())} for s in pass_shapes(FULL_GRID)]


@pytest.mark.parametrize("cost", [KNOWN, H100_8B.cost], ids=["known", "h100-8b"])
def test_fit_recovers_the_cost_model_that_made_the_passes(cost):
    fit = fit_cost(synthetic(cost))
    for name in FITTED:
        assert fit[name] == pytest.approx(getattr(cost, name), rel=1e-6), name
    assert fit["overlap_p"] == 1.0 and fit["max_rel_err"] < 1e-9 and fit["passes"] == 34


def test_split_fit_recovers_the_linear_pass_cost_that_made_the_passes():
    fit = fit_split_cost(synthetic(KNOWN_SPLIT))
    assert [fit[name] for name in SPLIT_FIGURES] == pytest.approx(list(KNOWN_SPLIT.coefficients()), rel=1e-6)
    assert fit["max_rel_err"] < 1e-9


def test_fits_need_a_pass_per_figure():
    with pytest.raises(ValueError, match="4 figures need at least as many passes, got 3"):
        fit_cost(synthetic(KNOWN)[:3])


def test_pass_figures_are_the_simulators():
    for s in pass_shapes(FULL_GRID):
        figures = s.figures()
        if s.kind == "prefill":
            assert figures["prefill_ctx_pairs"] == chunk_ctx_pairs(s.ctx, s.size)
            assert (figures["prefill_tokens"], figures["decode_rows"], figures["decode_ctx_tokens"]) == (s.size, 0, 0)
        else:
            assert (figures["prefill_tokens"], figures["prefill_ctx_pairs"]) == (0, 0)
            assert (figures["decode_rows"], figures["decode_ctx_tokens"]) == (s.size, s.size * s.ctx)


@pytest.mark.slow  # starts a process that imports torch and runs a tiny model (seconds)
def test_tiny_run_on_cpu_without_pydantic_then_fit(tmp_path):
    measured, fitted = tmp_path / "m.json", tmp_path / "f.json"
    args = ["--tiny", "--device", "cpu", "--repeats", "2", "--warmups", "1", "--out", str(measured)]
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYDANTIC, *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "--fit-only" in proc.stdout
    data = json.loads(measured.read_text())
    assert {"torch_version", "device_name", "model", "repeats", "cuda_graphs", "prefill_expand_kv"} <= set(data)
    assert data["tiny"] and data["device"] == "cpu" and not data["cuda_graphs"] and data["skipped"] == []
    assert data["prefill_check_max_err"] < 3e-2 and data["decode_check_max_err"] < 3e-2
    assert len(data["measurements"]) == len(pass_shapes(TINY_GRID))
    for m in data["measurements"]:
        assert set(FIGURES) | {"kind", "size", "ctx", "median_s", "times_s"} <= set(m) and len(m["times_s"]) == 2
        assert m["median_s"] > 0

    assert main(["--fit-only", str(measured), "--out", str(fitted)]) == 0  # result file: conftest's temp folder
    report = json.loads(fitted.read_text())
    assert set(FITTED) <= set(report["fit"]) and set(SPLIT_FIGURES) <= set(report["fit_split"])
    assert report["preset"]["name"] == "h100-8b"
    assert [r["pass"] for r in report["rows"]] == [s.label() for s in pass_shapes(TINY_GRID)]
