"""Simulator against reality (issue 7, item 4): real sglang's pass sequence with the plugin equals the
simulator engine's on the same deterministic workloads (see `sim_vs_sglang`)."""

from __future__ import annotations

import pytest

from harness.cpu_env import cpu_sglang_env
from harness.sglang_engine import run_engine
from scheduler.config import PolicyConfig
from scheduler.pass_trace import read_pass_trace
from tests.sglang_cpu.sim_vs_sglang import ENGINE, MIXES, agreement, sglang_batches, simulate

pytestmark = [pytest.mark.sglang_cpu, pytest.mark.timeout(1200)]  # server starts on a loaded 2-core CPU


@pytest.mark.parametrize("mixed_decode", [False, True], ids=["prefill-only", "mixed-chunk"])
def test_sglang_and_the_simulator_take_the_same_passes(tiny_model_dir, tmp_path, mixed_decode):
    trace = tmp_path / "passes.jsonl"
    result = run_engine(
        tiny_model_dir,
        sglang_batches(MIXES),
        cpu_sglang_env(pass_trace=trace, mixed_decode=mixed_decode),  # the plugin writes sglang's mixed chunk
        tmp_path / "engine",
        engine_kwargs=ENGINE,
        server_info=True,
    )
    finished = [o["meta_info"]["finish_reason"]["type"] for batch in result["outputs"] for o in batch]
    assert finished == ["length"] * sum(len(m.requests) for m in MIXES)
    cfg = PolicyConfig(
        chunk_budget_tokens=ENGINE["chunked_prefill_size"],
        max_running_requests=ENGINE["max_running_requests"],
        interactive_pass_tokens=ENGINE["chunked_prefill_size"],
        mixed_decode=mixed_decode,
    )
    log = (tmp_path / "engine" / "engine.log").read_text()
    assert f"mixed_decode={mixed_decode}" in log  # what sglang resolved, as the plugin's start line reports it
    sim = simulate(MIXES, cfg, result["server_info"]["max_total_num_tokens"])
    report = agreement(read_pass_trace(trace), sim)
    print(report.summary())
    assert report.unexplained == [], report.summary()
    assert report.num_agree + len(report.explained) == len(report.real) >= 25
