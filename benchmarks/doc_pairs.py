"""Two documents at once, one on each of two CPU sglang engines: what the plugin's pass sizes cost their prefill.

    python -m benchmarks.doc_pairs              # 10 pairs a variant a round, 2 rounds: about 10 minutes on 2 CPUs
    python -m benchmarks.doc_pairs --quick      # 4 pairs, 1 round

Two CPU sglang 0.5.23 servers (the peer benchmark's settings and tiny 32,768-token model) per variant, each sent a
new 12,000-token document at the same moment, the next pair 0.3 s after both answered: two engines prefilling side
by side on two cores, as the peer benchmark's `documents` workload has them, with nothing else running. Variants:
the plugin off, the policy as shipped for CPU engines (config.sglang-cpu.yaml's, with the peer benchmark's class
bound), the same with the largest passes its targets allow (`pass_throughput_slack` unset), and with a larger
slack. Each round runs the variants in turn, the order reversed the next round, each on servers started afresh.
Printed: the documents' TTFT (p50, mean, each round's p50), their prefill rate and its ratio to the plugin off,
and, from the plugin's pass trace, the passes a document took and their mean document tokens.
Writes docs/results/doc-pairs/ (`harness.results`).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.cpu_env import cpu_sglang_env
from harness.results import records
from loadtests import prompts
from loadtests.peers import (
    EngineSettings,
    app_policy,
    build_model,
    chars_per_token,
    first_content_s,
    local_servers,
    warm_up,
)
from scheduler.pass_trace import read_pass_timings
from scheduler.sglang_plugin.env import PASS_TRACE_VAR, policy_env

DOC_TOKENS = 12_000
MIN_PASS_TOKENS = 100
SHIPPED = app_policy(EngineSettings(), upstream=False)
VARIANTS: dict[str, dict[str, object] | None] = {
    "plugin off": None,
    "as shipped": SHIPPED,
    "largest passes": {**SHIPPED, "pass_throughput_slack": None},
    "slack 0.05": {**SHIPPED, "pass_throughput_slack": 0.05},
}
"""The plugin's policy by variant; None: the plugin off (upstream sglang)."""
COLUMNS = "variant", "doc TTFT p50 (s)", "mean (s)", "each round's p50 (s)", "doc tok/s", "vs plugin off"
COLUMNS += "passes a document", "tokens a pass"
Rounds = dict[str, list[list[float]]]
"""Document TTFTs by variant, a list a round."""


def server_env(policy: dict[str, object] | None, trace: Path) -> dict[str, str]:
    if policy is None:
        return cpu_sglang_env(plugin_enabled=False)
    return {**cpu_sglang_env(), **policy_env(policy), PASS_TRACE_VAR: str(trace)}


@contextlib.contextmanager
def two_servers(model: Path, policy: dict[str, object] | None, out: Path) -> Iterator[list[str]]:
    envs = [server_env(policy, out / f"trace-{i}.jsonl") for i in range(2)]
    with local_servers(model, EngineSettings(), envs, [out / f"{i}.log" for i in range(2)]) as servers:
        urls = [f"http://127.0.0.1:{s.port}" for s in servers]
        for url in urls:
            warm_up(url, str(model))
        yield urls


def pairs(urls: list[str], model: Path, cpt: float, count: int, rng: random.Random) -> list[float]:
    """Document TTFTs of `count` pairs, a new document on each server at once."""
    ttfts: list[float] = []
    with ThreadPoolExecutor(2) as pool:
        for _ in range(count):
            docs = [prompts.document(f"{rng.random():.12f}", DOC_TOKENS, cpt, rng) + "\nQuestion?" for _ in urls]
            ttfts += pool.map(lambda u, d: first_content_s(u, str(model), d, 1), urls, docs)
            time.sleep(0.3)
    return ttfts


def passes_of(traces: list[Path]) -> tuple[int, int]:
    """(prefill passes of at least `MIN_PASS_TOKENS`, their tokens) in the plugin's timed passes: the documents',
    not the warm-up's."""
    prefills = [r["prefill_tokens"] for t in traces for r in read_pass_timings(t)]
    documents = [n for n in prefills if n >= MIN_PASS_TOKENS]
    return len(documents), sum(documents)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.doc_pairs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=10, help="Pairs of documents a variant a round.")
    ap.add_argument("--rounds", type=int, default=2, help="Rounds, the variants' order reversed each round.")
    ap.add_argument("--quick", action="store_true", help="4 pairs, 1 round.")
    args = ap.parse_args(argv)
    if args.quick:
        args.pairs, args.rounds = 4, 1
    if args.pairs < 1 or args.rounds < 1:
        ap.error(f"--pairs {args.pairs} and --rounds {args.rounds} must both be at least 1")
    return args


@records("doc-pairs", "Two documents at once on two CPU sglang engines, by pass-size policy")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ttfts: Rounds = {name: [] for name in VARIANTS}
    counted: dict[str, tuple[int, int]] = dict.fromkeys(VARIANTS, (0, 0))
    with tempfile.TemporaryDirectory(prefix="doc-pairs-") as tmp:
        model = build_model(Path(tmp) / "model", EngineSettings().context_tokens)
        cpt = chars_per_token(model)
        rng = random.Random(11)
        for round_ in range(args.rounds):
            for name in list(VARIANTS)[:: 1 if round_ % 2 == 0 else -1]:
                out = Path(tmp) / f"{name.replace(' ', '_')}-{round_}"
                out.mkdir()
                with two_servers(model, VARIANTS[name], out) as urls:
                    ttfts[name].append(pairs(urls, model, cpt, args.pairs, rng))
                passes, tokens = passes_of(sorted(out.glob("trace-*.jsonl")))
                counted[name] = (counted[name][0] + passes, counted[name][1] + tokens)
                print(f"round {round_ + 1} {name}: p50 {statistics.median(ttfts[name][-1]):.3f} s", flush=True)
    print_table(args, ttfts, counted)
    return 0


def print_table(args: argparse.Namespace, ttfts: Rounds, counted: dict[str, tuple[int, int]]) -> None:
    print(
        f"\n{DOC_TOKENS}-token documents, a new one on each of two engines at once; {args.pairs} pairs a variant a "
        f"round, {args.rounds} round(s), the order reversed each round; {EngineSettings()}"
    )
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + " --- |" * len(COLUMNS))
    off = None
    for name, rounds in ttfts.items():
        pooled = [t for r in rounds for t in r]
        mean = statistics.mean(pooled)
        rate = DOC_TOKENS / mean
        off = off or rate
        passes, tokens = counted[name]
        per_doc = f"{passes / len(pooled):.1f}" if passes else "—"
        per_pass = f"{tokens / passes:,.0f}" if passes else "—"
        each = ", ".join(f"{statistics.median(r):.3f}" for r in rounds)
        print(
            f"| {name} | {statistics.median(pooled):.3f} | {mean:.3f} | {each} | {rate:,.0f} | {rate / off:.3f}x | "
            f"{per_doc} | {per_pass} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
