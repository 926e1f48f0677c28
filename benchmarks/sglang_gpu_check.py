"""GPU-only check: sglang 0.5.23 with and without the fairshare plugin on seed 000's scenario, scaled down.

For each mode (plugin on: ``FAIRSHARE_PLUGIN_ENABLED=1``, off: ``=0``) it launches
``python -m sglang.launch_server`` on loopback with the seed's limits (``--chunked-prefill-size 8192
--max-running-requests 10``, so F = 409), then

1. warms the server up, sends one cold document alone and measures its prefill throughput
   (prompt tokens / time to its first token);
2. sends a second cold document and, while it prefills, short questions (30 tokens each) spread over the
   lone document's prefill time: the questions' time to first token (seed 000's symptom) and the
   document's prefill throughput in company.

It prints short TTFT (p50, max) and long prefill throughput (alone, with questions) for both modes and
their ratios, and checks from the server log that the plugin loaded in the scheduler process (the
start-up line ``... long_prefill_token_threshold=...``) exactly when it should.

Nothing is downloaded (GPU machines have no network either): pass ``--model-path`` to local weights, or
``--tiny-model`` to build a random-weight Llama with transformers in a temporary directory; prompts are
token ids and the tiny model runs with ``--skip-tokenizer-init``. Absolute times mean something only on
the machine they were measured on; compare the on/off ratios.

    python benchmarks/sglang_gpu_check.py --tiny-model
    python benchmarks/sglang_gpu_check.py --model-path /models/Llama-3.1-8B-Instruct --doc-tokens 65536
    python benchmarks/sglang_gpu_check.py --dry-run          # the plan and the server commands, no GPU
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SEED000_DOC_TOKENS = 130_000
QUESTION_TOKENS = 30
PLUGIN_LINE = "long_prefill_token_threshold="


@dataclass
class Timing:
    prompt_tokens: int
    sent_s: float
    first_token_s: float | None = None
    done_s: float | None = None
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.sent_s


@dataclass
class ModeResult:
    mode: str
    plugin_line: str | None
    lone_doc: Timing
    company_doc: Timing
    questions: list[Timing] = field(default_factory=list)

    @property
    def lone_tok_per_s(self) -> float:
        return self.lone_doc.prompt_tokens / self.lone_doc.ttft_s

    @property
    def company_tok_per_s(self) -> float:
        return self.company_doc.prompt_tokens / self.company_doc.ttft_s

    @property
    def question_ttfts_s(self) -> list[float]:
        return [q.ttft_s for q in self.questions if q.ttft_s is not None]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    model = p.add_mutually_exclusive_group()
    model.add_argument("--model-path", help="local model weights (nothing is downloaded)")
    model.add_argument("--tiny-model", action="store_true", help="build a random-weight Llama locally")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the server commands only")
    p.add_argument("--doc-tokens", type=int, default=SEED000_DOC_TOKENS // 4, help="document prompt tokens")
    p.add_argument("--questions", type=int, default=4, help="questions sent during the document's prefill")
    p.add_argument("--question-tokens", type=int, default=QUESTION_TOKENS)
    p.add_argument("--question-output-tokens", type=int, default=16)
    p.add_argument("--doc-output-tokens", type=int, default=8)
    p.add_argument("--chunked-prefill-size", type=int, default=8192)
    p.add_argument("--max-running-requests", type=int, default=10, help="the seed's limit: F = 8192 / 20 = 409")
    p.add_argument("--modes", default="off,on", help="comma-separated: off, on")
    p.add_argument("--port", type=int, default=31_000)
    p.add_argument("--skip-tokenizer-init", action="store_true", help="implied by --tiny-model")
    p.add_argument("--server-arg", action="append", default=[], help="extra sglang argument (repeatable)")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for the plugin-on server (repeatable)")
    p.add_argument("--startup-timeout-s", type=float, default=900.0)
    p.add_argument("--request-timeout-s", type=float, default=900.0)
    p.add_argument("--log-dir", type=Path, default=None, help="keep the server logs here")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = p.parse_args(argv)
    if not args.dry_run and not (args.model_path or args.tiny_model):
        p.error("give --model-path or --tiny-model (or --dry-run)")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(args.modes) <= {"on", "off"}:
        p.error("--modes takes on and/or off")
    return args


def context_length(args: argparse.Namespace) -> int:
    return args.doc_tokens + max(args.doc_output_tokens, args.question_output_tokens) + 256


def build_tiny_model(directory: Path, max_positions: int) -> Path:
    """A random-weight Llama (4 layers, 512 wide) saved with transformers; no tokenizer needed."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32_000,
        hidden_size=512,
        intermediate_size=1_376,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=max_positions,
        dtype="bfloat16",
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    return directory


def vocab_size(model_path: str | None) -> int:
    config = Path(model_path or "") / "config.json"
    if model_path and config.exists():
        return int(json.loads(config.read_text()).get("vocab_size", 32_000))
    return 32_000


def token_ids(n: int, seed: int, vocab: int) -> list[int]:
    """Distinct random ids per request (no prefix-cache hits between requests)."""
    rng = random.Random(seed)
    return [rng.randrange(100, vocab - 100) for _ in range(n)]


def server_command(args: argparse.Namespace, model_path: str) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model_path,
        "--host",
        "127.0.0.1",
        "--port",
        str(args.port),
        "--chunked-prefill-size",
        str(args.chunked_prefill_size),
        "--max-running-requests",
        str(args.max_running_requests),
        "--context-length",
        str(context_length(args)),
        "--log-level",
        "info",
    ]
    if args.tiny_model or args.skip_tokenizer_init:
        cmd.append("--skip-tokenizer-init")
    for extra in args.server_arg:
        cmd.extend(extra.split())
    return cmd


def server_env(args: argparse.Namespace, mode: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRSHARE_")}
    env["FAIRSHARE_PLUGIN_ENABLED"] = "1" if mode == "on" else "0"
    if mode == "on":
        for item in args.env:
            key, _, value = item.partition("=")
            env[key] = value
    return env


def question_offsets_s(lone_ttft_s: float, num_questions: int) -> list[float]:
    """When each question is sent, after the document: spread over the document's prefill."""
    return [lone_ttft_s * (k + 1) / (num_questions + 1) for k in range(num_questions)]


def parse_sse_line(line: bytes) -> dict | str | None:
    """One server-sent-events line of sglang's ``/generate`` stream: a dict, ``"[DONE]"``, or None."""
    text = line.decode("utf-8", "replace").strip()
    if not text.startswith("data:"):
        return None
    payload = text[len("data:") :].strip()
    return payload if payload == "[DONE]" else json.loads(payload)


def generate(port: int, ids: list[int], max_new_tokens: int, timing: Timing, timeout_s: float) -> None:
    body = json.dumps(
        {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True},
            "stream": True,
        }
    )
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        timing.sent_s = time.perf_counter()
        conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            timing.error = f"HTTP {resp.status}: {resp.read()[:300]!r}"
            return
        while line := resp.readline():
            event = parse_sse_line(line)
            if event is None:
                continue
            if event == "[DONE]":
                break
            if isinstance(event, dict) and "error" in event:
                timing.error = str(event["error"])
                return
            if timing.first_token_s is None:
                timing.first_token_s = time.perf_counter()
        timing.done_s = time.perf_counter()
    except OSError as e:
        timing.error = repr(e)
    finally:
        conn.close()


def wait_ready(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sglang exited with code {proc.returncode} while starting")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(2)
    raise TimeoutError(f"sglang not ready after {timeout_s:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    """Stop the server we started (its own process group) and nothing else."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def run_mode(args: argparse.Namespace, mode: str, model_path: str, vocab: int, log_dir: Path) -> ModeResult:
    log_path = log_dir / f"sglang-{mode}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            server_command(args, model_path),
            env=server_env(args, mode),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_ready(args.port, proc, args.startup_timeout_s)
        warm = Timing(16, 0.0)
        generate(args.port, token_ids(16, 1, vocab), 2, warm, args.request_timeout_s)
        if warm.error:
            raise RuntimeError(f"warm-up failed: {warm.error}")

        lone = Timing(args.doc_tokens, 0.0)
        generate(args.port, token_ids(args.doc_tokens, 2, vocab), args.doc_output_tokens, lone, args.request_timeout_s)
        if lone.ttft_s is None:
            raise RuntimeError(f"lone document failed: {lone.error}")

        company = Timing(args.doc_tokens, 0.0)
        questions = [Timing(args.question_tokens, 0.0) for _ in range(args.questions)]
        doc_thread = threading.Thread(
            target=generate,
            args=(
                args.port,
                token_ids(args.doc_tokens, 3, vocab),
                args.doc_output_tokens,
                company,
                args.request_timeout_s,
            ),
        )
        doc_thread.start()
        start = time.perf_counter()
        threads = []
        for k, offset in enumerate(question_offsets_s(lone.ttft_s, args.questions)):
            time.sleep(max(0.0, start + offset - time.perf_counter()))
            ids = token_ids(args.question_tokens, 100 + k, vocab)
            t = threading.Thread(
                target=generate,
                args=(args.port, ids, args.question_output_tokens, questions[k], args.request_timeout_s),
            )
            t.start()
            threads.append(t)
        for t in [doc_thread, *threads]:
            t.join()
        failed = [q.error for q in [company, *questions] if q.ttft_s is None]
        if failed:
            raise RuntimeError(f"requests failed: {failed}")
    finally:
        stop(proc)
    plugin_line = next((line.strip() for line in log_path.read_text().splitlines() if PLUGIN_LINE in line), None)
    return ModeResult(mode, plugin_line, lone, company, questions)


def print_plan(args: argparse.Namespace, model_path: str) -> None:
    print(
        f"document: {args.doc_tokens} prompt tokens (seed 000: {SEED000_DOC_TOKENS}), {args.doc_output_tokens} output"
    )
    print(f"questions: {args.questions} x {args.question_tokens} tokens, sent at fractions of the lone prefill time:")
    print("  " + ", ".join(f"{k + 1}/{args.questions + 1}" for k in range(args.questions)))
    for mode in args.modes:
        env = server_env(args, mode)
        fairshare = " ".join(f"{k}={v}" for k, v in sorted(env.items()) if k.startswith("FAIRSHARE_"))
        print(f"[{mode}] {fairshare} {' '.join(server_command(args, model_path))}")


def summary_lines(results: list[ModeResult]) -> list[str]:
    rows = [
        "mode  short TTFT p50   short TTFT max   long prefill alone   long prefill w/ questions   plugin loaded",
    ]
    for r in results:
        ttfts = r.question_ttfts_s
        loaded = "yes" if r.plugin_line else "no"
        rows.append(
            f"{r.mode:<4}  {statistics.median(ttfts):>10.3f} s   {max(ttfts):>10.3f} s   "
            f"{r.lone_tok_per_s:>12,.0f} tok/s   {r.company_tok_per_s:>17,.0f} tok/s   {loaded}"
        )
    by_mode = {r.mode: r for r in results}
    if {"on", "off"} <= set(by_mode):
        on, off = by_mode["on"], by_mode["off"]
        p50_ratio = statistics.median(on.question_ttfts_s) / statistics.median(off.question_ttfts_s)
        rows.append(
            f"on/off  short TTFT p50 x{p50_ratio:.2f}"
            f"   max x{max(on.question_ttfts_s) / max(off.question_ttfts_s):.2f}"
            f"   long alone x{on.lone_tok_per_s / off.lone_tok_per_s:.2f}"
            f"   long w/ questions x{on.company_tok_per_s / off.company_tok_per_s:.2f}"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fairshare-gpu-check-") as tmp:
        tmp_dir = Path(tmp)
        model_path = args.model_path or str(tmp_dir / "tiny-llama")
        if args.dry_run:
            print_plan(args, model_path)
            return 0
        if args.tiny_model:
            build_tiny_model(Path(model_path), context_length(args))
        log_dir = args.log_dir or tmp_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        print_plan(args, model_path)
        vocab = vocab_size(model_path)
        results = [run_mode(args, mode, model_path, vocab, log_dir) for mode in args.modes]
        print("\n".join(summary_lines(results)))
        for r in results:
            print(f"[{r.mode}] scheduler start-up line: {r.plugin_line or '(none)'}")
        if args.out:
            args.out.write_text(
                json.dumps(
                    [
                        {
                            "mode": r.mode,
                            "plugin_loaded": r.plugin_line is not None,
                            "short_ttft_s": r.question_ttfts_s,
                            "long_prefill_tok_per_s_alone": r.lone_tok_per_s,
                            "long_prefill_tok_per_s_with_questions": r.company_tok_per_s,
                        }
                        for r in results
                    ],
                    indent=2,
                )
            )
        wrong = [r.mode for r in results if (r.plugin_line is not None) != (r.mode == "on")]
        if wrong:
            print(f"plugin loading did not match the mode in: {wrong}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
