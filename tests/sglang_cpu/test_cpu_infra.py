"""The CPU sglang test infrastructure itself: the `sgl_kernel` stand-in and the in-process engine runner."""

from __future__ import annotations

import socket

import pytest
import torch
from setuptools import find_packages

from harness import net, sglang_server
from harness.cpu_env import CPU_SERVER_ARGS, REPO_ROOT, cpu_sglang_env
from harness.sgl_kernel_standin import sgl_kernel
from harness.sglang_engine import run_engine
from harness.sglang_server import PLUGIN_START_LINE
from scheduler.pass_trace import read_pass_trace


def test_stand_in_assigns_kv_locations_in_order():
    req_to_token = torch.zeros(3, 8, dtype=torch.int32)
    sgl_kernel.assign_req_to_token_pool_cpu(
        torch.tensor([2, 0]), req_to_token, torch.tensor([1, 0]), torch.tensor([4, 2]), torch.tensor([7, 8, 9, 5, 6]), 8
    )
    assert req_to_token[2].tolist() == [0, 7, 8, 9, 0, 0, 0, 0]
    assert req_to_token[0].tolist() == [5, 6, 0, 0, 0, 0, 0, 0]
    assert req_to_token[1].tolist() == [0] * 8


def test_stand_in_fails_loudly_naming_the_symbol():
    with pytest.raises(NotImplementedError, match="copy_all_layer_kv_cache_cpu"):
        sgl_kernel.copy_all_layer_kv_cache_cpu()
    with pytest.raises(AttributeError, match=r"sgl_kernel\.fused_add_rmsnorm_cpu is not provided"):
        sgl_kernel.fused_add_rmsnorm_cpu  # noqa: B018
    with pytest.raises(ImportError, match="silu_and_mul"):
        from harness.sgl_kernel_standin.sgl_kernel import silu_and_mul  # noqa: F401


def test_stand_in_and_harness_are_never_shipped():
    shipped = find_packages(where=REPO_ROOT, include=["scheduler*", "serve_app*"])  # pyproject's include
    assert shipped and not [p for p in shipped if "sgl_kernel" in p or "harness" in p or "tests" in p]


@pytest.mark.sglang_cpu
@pytest.mark.timeout(1200)
def test_in_process_engine_with_priority_scheduling_runs_the_policy(tiny_model_dir, tmp_path):
    """sglang turns priority preemption on with priority scheduling; the plugin used to step aside entirely.
    Now only passes where preemption may act are upstream's: here the requests fit the free slots."""
    trace = tmp_path / "passes.jsonl"
    prompts = [[5 + i % 900 for i in range(600)], [900 - i for i in range(20)]]
    greedy = {"max_new_tokens": 3, "temperature": 0.0, "ignore_eos": True}
    result = run_engine(
        tiny_model_dir,
        [{"input_ids": prompts, "sampling_params": [greedy] * 2, "rid": ["doc", "q"]}],
        cpu_sglang_env(pass_trace=trace),
        tmp_path / "engine",
        engine_kwargs={
            "chunked_prefill_size": 64,
            "max_running_requests": 4,
            "max_total_tokens": 4096,
            "enable_priority_scheduling": True,
        },
    )
    (outputs,) = result["outputs"]
    assert [len(o["output_ids"]) for o in outputs] == [3, 3]
    assert [o["meta_info"]["prompt_tokens"] for o in outputs] == [600, 20]
    log = (tmp_path / "engine" / "engine.log").read_text()
    assert log.count(PLUGIN_START_LINE) == 1  # one scheduler process, the policy attached
    from harness.cpu_attention import STARTED_LINE  # imports sglang: only in the test that runs an engine

    assert STARTED_LINE in log  # extend attends from the chunk's queries, as on a GPU
    assert "fairshare policy: skip_ahead=False" in log  # no overtaking by arrival under priorities
    records = read_pass_trace(trace)
    assert records[0]["admitted"][0][0] == "doc" and ["q", 20] in records[0]["admitted"]
    assert sum(t for r in records for rid, t in r["admitted"] if rid == "doc") == 600
    assert any(g[0] == "doc" and g[2] for r in records for g in r["grants"])  # the policy cut the document


@pytest.mark.sglang_cpu
@pytest.mark.timeout(1200)
def test_a_server_whose_probed_port_is_taken_before_it_binds_starts_on_another(tiny_model_dir, tmp_path, monkeypatch):
    """The server binds its HTTP port only once the engine is up; another process can take the port meanwhile
    (CI saw it). The harness must then start it again on a fresh port, not fail the tests that needed it."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        probes = iter([taken.getsockname()[1], net.free_port()])
        monkeypatch.setattr(sglang_server, "free_port", lambda: next(probes))
        server = sglang_server.LocalServer(tiny_model_dir, CPU_SERVER_ARGS, cpu_sglang_env(), tmp_path / "s.log")
        with server:
            assert server.port != taken.getsockname()[1]
            assert server.request("GET", "/v1/models")["data"], server.log_tail()
