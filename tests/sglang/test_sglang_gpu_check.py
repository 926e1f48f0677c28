"""`benchmarks/sglang_gpu_check.py`: its pieces on CPU, and the whole check where a GPU is available."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import sglang_gpu_check as gpu_check

REPO = Path(__file__).parents[2]
SCRIPT = [sys.executable, "-m", "benchmarks.sglang_gpu_check"]


def test_dry_run_prints_the_plan_and_both_server_commands():
    out = subprocess.run(
        [*SCRIPT, "--dry-run", "--doc-tokens", "4096", "--env", "FAIRSHARE_DIAGNOSTICS=true"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    off, on = (line for line in out.splitlines() if line.startswith("[o"))
    assert off.startswith("[off] FAIRSHARE_PLUGIN_ENABLED=0 ") and "FAIRSHARE_DIAGNOSTICS" not in off
    assert on.startswith("[on] FAIRSHARE_DIAGNOSTICS=true FAIRSHARE_PLUGIN_ENABLED=1 ")
    for line in (off, on):
        assert "-m sglang.launch_server" in line
        assert "--chunked-prefill-size 8192 --max-running-requests 10" in line
    assert "document: 4096 prompt tokens to start" in out and "until its lone prefill lasts 3 s" in out


def test_stream_parsing_and_question_timing():
    assert gpu_check.parse_sse_line(b'data: {"output_ids": [5]}\n') == {"output_ids": [5]}
    assert gpu_check.parse_sse_line(b"data: [DONE]\n") == "[DONE]"
    assert gpu_check.parse_sse_line(b"\n") is None
    assert gpu_check.question_offsets_s(10.0, 4) == [2.0, 4.0, 6.0, 8.0]
    assert len(set(gpu_check.token_ids(30, 100, 32_000))) > 20


def test_summary_reports_ratios():
    def mode(name, ttft, lone, company):
        doc = gpu_check.Timing(1000, 0.0, first_token_s=1000 / lone)
        with_q = gpu_check.Timing(1000, 0.0, first_token_s=1000 / company)
        questions = [gpu_check.Timing(30, 0.0, first_token_s=t) for t in ttft]
        return gpu_check.ModeResult(name, "line" if name == "on" else None, doc, with_q, questions, 1000)

    lines = gpu_check.summary_lines([mode("off", [4.0, 6.0], 1000, 1000), mode("on", [0.5, 1.0], 900, 950)])
    assert lines[-1].startswith("on/off  short TTFT p50 x0.15   max x0.17   long alone x0.90")


def _gpu_ready() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and importlib.util.find_spec("sgl_kernel") is not None


@pytest.mark.gpu
@pytest.mark.skipif(
    not _gpu_ready(),
    reason="GPU-only figures: needs a CUDA GPU and sglang 0.5.23 with its CUDA dependencies (the CPU test env "
    "installs sglang --no-deps; tests/sglang_cpu runs this script on CPU); run "
    "`python -m benchmarks.sglang_gpu_check --dummy-model` on a GPU machine",
)
def test_gpu_check_runs_with_an_8b_shaped_dummy_model(tmp_path):
    out = subprocess.run(
        [*SCRIPT, "--dummy-model", "--out", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "on/off" in out.stdout


def test_streaming_client_against_a_local_stand_in_server():
    """`generate` reads sglang's `/generate` event stream: time to first token, then `[DONE]`."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    received = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            received.update(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(3):
                self.wfile.write(b'data: {"output_ids": [%d]}\n\n' % i)
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        timing = gpu_check.Timing(5, 0.0)
        gpu_check.generate(server.server_address[1], [1, 2, 3, 4, 5], 3, timing, timeout_s=10)
    finally:
        server.shutdown()
    assert timing.error is None and 0 <= timing.ttft_s <= timing.done_s - timing.sent_s
    assert received == {
        "input_ids": [1, 2, 3, 4, 5],
        "sampling_params": {"max_new_tokens": 3, "temperature": 0.0, "ignore_eos": True},
        "stream": True,
    }
