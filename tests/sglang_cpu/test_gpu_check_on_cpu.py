"""`benchmarks/sglang_gpu_check.py` end to end on CPU at a small scale (tiny model): the script itself works.
Its figures mean nothing here (CPU timings); the GPU run is `--dummy-model` on a GPU machine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.cpu_env import CPU_SERVER_ARGS, REPO_ROOT, cpu_sglang_env
from harness.results import RESULTS_DIR_ENV

pytestmark = [pytest.mark.sglang_cpu, pytest.mark.timeout(1800)]  # two server starts on a loaded CPU

SCRIPT = [sys.executable, "-m", "benchmarks.sglang_gpu_check"]


def test_gpu_check_script_runs_on_cpu_with_the_tiny_model(tmp_path):
    small = [
        "--tiny-model",
        "--doc-tokens", "1024",
        "--max-doc-tokens", "6144",
        "--min-lone-prefill-s", "0.6",
        "--questions", "1",
        "--question-output-tokens", "3",
        "--doc-output-tokens", "2",
        "--chunked-prefill-size", "256",
        "--max-running-requests", "4",
        "--server-arg", " ".join(CPU_SERVER_ARGS),
        "--startup-timeout-s", "600",
        "--out", str(tmp_path / "r.json"),
    ]  # fmt: skip
    log = tmp_path / "check.log"
    env = {**cpu_sglang_env(), RESULTS_DIR_ENV: str(tmp_path / "results")}
    with log.open("w") as sink:
        proc = subprocess.Popen([*SCRIPT, *small], stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    try:
        rc = proc.wait(timeout=1500)
    finally:
        if proc.poll() is None:  # timed out (here or pytest's timeout): the script stops its server on SIGTERM
            proc.terminate()
            proc.wait(timeout=120)
    out = log.read_text()
    assert rc == 0, out[-6000:]
    assert "on/off  short TTFT p50" in out
    results = {r["mode"]: r for r in json.loads((tmp_path / "r.json").read_text())}
    assert {m: r["plugin_loaded"] for m, r in results.items()} == {"off": False, "on": True}
    for r in results.values():
        assert r["lone_prefill_s"] >= 0.6 and r["questions_during_prefill"] == 1
    written = (tmp_path / "results" / "sglang-gpu-check" / "latest.md").read_text()
    assert "-m benchmarks.sglang_gpu_check --tiny-model" in written and "on/off  short TTFT p50" in written
