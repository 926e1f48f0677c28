"""Real sglang on CPU: chats arriving during long documents, the plugin (SLO sizing from its online pass-cost fit)
against upstream sglang in the same run.

Two servers (``python -m sglang.launch_server``, the tiny random-weight Llama built with a 32,768-token context, so
a document of 10,000-14,000 tokens takes seconds to prefill on one CPU core) serve the same workload side by side:
``fairshare``, the plugin as deployed (its pass trace on), and ``upstream``, sglang with the plugin off
(``FAIRSHARE_PLUGIN_ENABLED=0``). Everything else is equal, ``--enable-mixed-chunk`` included (the plugin turns it
on by default). Runs alternate between them (the order flips every run), after one warm-up run each.

A run: one document (its length drawn per run, the same in both modes) is sent, and chats (60-token questions,
16 tokens out) follow at drawn times while it prefills (Poisson arrivals in its first seconds: the same times in
both modes). The run ends when every request has finished and the server is idle.

Printed:

(a) the online fit's accuracy: each forward pass the plugin timed during the measured runs, against what the fit
    in force predicted for it before the pass joined its window (`scheduler.pass_cost_fit`): the median absolute
    relative error (target <= 15%), over all passes and by kind (with prefill, decode only), beside the noise floor
    (`noise_floor`: how far passes of the same figures differ from one another, which no model of those figures
    predicts); the error the fit states, which the SLO sizer charges each predicted pass with; and the fitted model
    as the server reports it (``/server_info``);
(b) per mode: the chats' TTFT p50 / p99 (nearest rank) against the TTFT target, their time-between-tokens p99
    against the TBT target, SLO attainment (`scheduler.slo.meets_slo`: the policy's own targets, the defaults of
    `PolicyConfig`), and the documents' prefill throughput (document tokens / the document's TTFT; median over
    runs) with the ratio of fairshare's to upstream's (the median of the per-run ratios, runs paired in order).

CPU timings on a shared machine are noisy: read the medians and ratios, and compare modes within one run only.

    python -m benchmarks.slo_sglang             # 5 measured runs per mode
    python -m benchmarks.slo_sglang --runs 9

A policy knob of the plugin's server: ``--set KEY=VALUE`` (a `PolicyConfig` field, ``none`` for None; repeatable).
``--against KEY=VALUE`` compares it with the plugin under the same policy but that knob, in place of upstream (the
second server is then named ``baseline``): what one knob does, in one run. The CPU config's policy with and without
its cap on a chat's own pass (`admit_pass_long_tokens`, docs/tuning.md):

    python -m benchmarks.slo_sglang --runs 9 --set pass_throughput_slack=0.02 --set delivery_margin_s=0.01 \
        --set admit_pass_long_tokens=0 --against admit_pass_long_tokens=none
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.cpu_env import CPU_SERVER_ARGS, cpu_sglang_env
from harness.results import recording
from harness.sglang_server import LocalServer
from harness.sglang_traffic import StreamedGeneration, prompt_ids, wait_idle
from harness.tiny_model import TinyModelSpec, build_tiny_model
from scheduler.config import PolicyConfig, env_var_name
from scheduler.pass_trace import read_pass_timings
from scheduler.sglang_plugin.env import explicit_policy_env
from scheduler.slo import SloTargets, attainment, gap_quantile_s, meets_slo

MODEL = TinyModelSpec(max_position_embeddings=32_768)
DOC_TOKENS = (10_000, 14_000)
DOC_OUTPUT_TOKENS = 4
CHAT_PROMPT_TOKENS = 60
CHAT_OUTPUT_TOKENS = 16
CHAT_MEAN_GAP_S = 0.4
CHAT_WINDOW_S = (0.2, 2.0)
"""Chats arrive at Poisson times within this window after the document is sent: while it prefills."""
SERVER_ARGS = [
    "--chunked-prefill-size",
    "8192",
    "--max-running-requests",
    "8",
    "--max-total-tokens",
    "48000",
    "--context-length",
    str(MODEL.max_position_embeddings),
    "--enable-mixed-chunk",  # what the plugin turns on by default: upstream runs it too
    "--log-level",
    "warning",
]
BASELINE = "baseline"
"""The second server's name with `--against` (the plugin with some knobs changed); else it is upstream."""
TRACE_NAME = "fairshare-trace.jsonl"
Server = tuple[LocalServer, Path | None]
"""A running server and its pass trace (the plugin's server only)."""
FIT_ERROR_TARGET = 0.15
NOISE_BUCKET = 0.1
"""Passes whose figures (prefill tokens, attended pairs, decode contexts) fall in the same 10%-wide bucket, at the
same decode rows, count as the same pass for the noise floor."""
NOISE_GROUP = 4
"""The fewest passes a group needs to count for the noise floor (a group of one has no spread)."""
TARGETS = SloTargets(ttft_s=PolicyConfig().ttft_target_s, tbt_s=PolicyConfig().tbt_target_s)
"""The chats' targets: the policy's defaults, which the fairshare server runs with."""


@dataclass(frozen=True)
class Schedule:
    """One run's workload: the document's length and the chats' send offsets (seconds after the document)."""

    doc_tokens: int
    chat_offsets_s: tuple[float, ...]


def schedule(run: int) -> Schedule:
    rng = random.Random(run)
    doc = rng.randrange(*DOC_TOKENS)
    offsets, t = [], CHAT_WINDOW_S[0]
    while True:
        t += rng.expovariate(1 / CHAT_MEAN_GAP_S)
        if t > CHAT_WINDOW_S[1]:
            break
        offsets.append(round(t, 3))
    return Schedule(doc, tuple(offsets) or (CHAT_WINDOW_S[0],))


@dataclass
class RunResult:
    doc_tokens: int
    doc_ttft_s: float
    chat_ttft_s: list[float]
    chat_gaps_s: list[list[float]]
    span_s: float
    timed_passes: list[dict[str, Any]] = field(default_factory=list)
    """The plugin's timed passes during the run (fairshare only)."""

    @property
    def doc_tok_per_s(self) -> float:
        return self.doc_tokens / self.doc_ttft_s


def one_run(server: LocalServer, run_id: str, plan: Schedule, seed: int) -> RunResult:
    """Send the run's document and chats as scheduled; return when all have finished and the server is idle."""
    started = time.monotonic()
    doc = StreamedGeneration(server.port, f"{run_id}-doc", prompt_ids(plan.doc_tokens, seed), DOC_OUTPUT_TOKENS)
    chats = []
    for i, offset in enumerate(plan.chat_offsets_s):
        time.sleep(max(0.0, started + offset - time.monotonic()))
        ids = prompt_ids(CHAT_PROMPT_TOKENS, seed * 1000 + i + 1)
        chats.append(StreamedGeneration(server.port, f"{run_id}-chat{i}", ids, CHAT_OUTPUT_TOKENS))
    for gen in (doc, *chats):
        gen.finish()
    wait_idle(server)
    return RunResult(
        doc_tokens=plan.doc_tokens,
        doc_ttft_s=doc.ttft_s,
        chat_ttft_s=[c.ttft_s for c in chats],
        chat_gaps_s=[c.gaps_s() for c in chats],
        span_s=max(t for g in (doc, *chats) for t, _ in g.chunks[-1:]) - started,
    )


def nearest_rank(values: list[float], q: float) -> float:
    """The `q` quantile (0-1) by nearest rank, as `scheduler.slo` takes a stream's gap p99."""
    return gap_quantile_s(values, q)


def relative_misses(timed: list[dict[str, Any]]) -> list[float]:
    return [abs(t["predicted_s"] / t["measured_s"] - 1) for t in timed]


def _bucket(value: float) -> int:
    return -1 if value <= 0 else round(math.log(value) / math.log(1 + NOISE_BUCKET))


def noise_floor(timed: list[dict[str, Any]]) -> tuple[float | None, int]:
    """The error no model of a pass's figures gets below: passes whose figures fall in the same `NOISE_BUCKET`-wide
    bucket (log scale) at the same decode rows are grouped, and each is predicted by its group's median, its miss
    taken as the fit's are (``|median / measured - 1|``); the median miss over every group of at least
    `NOISE_GROUP` passes, and how many passes it covers (None, 0: no such group)."""
    groups: dict[tuple[int, ...], list[float]] = defaultdict(list)
    for t in timed:
        key = tuple(_bucket(t[f]) for f in ("prefill_tokens", "prefill_ctx_pairs", "decode_ctx_tokens"))
        groups[(*key, t["decode_rows"])].append(t["measured_s"])
    spread = [abs(statistics.median(ys) / y - 1) for ys in groups.values() if len(ys) >= NOISE_GROUP for y in ys]
    return (statistics.median(spread) if spread else None), len(spread)


def fit_table(timed: list[dict[str, Any]]) -> list[str]:
    kinds = {
        "all passes": timed,
        "with prefill": [t for t in timed if t["prefill_tokens"] > 0],
        "decode only": [t for t in timed if t["prefill_tokens"] == 0],
    }
    lines = [
        f"{'passes':>14} | {'n':>5} | {'median abs error':>16} | {'p90 abs error':>13} | noise floor (passes grouped)"
    ]
    for name, rows in kinds.items():
        misses = relative_misses(rows)
        if misses:
            floor, grouped = noise_floor(rows)
            lines.append(
                f"{name:>14} | {len(rows):>5} | {statistics.median(misses):>16.1%} | {nearest_rank(misses, 0.9):>13.1%}"
                f" | {'—' if floor is None else f'{floor:.1%}'} ({grouped})"
            )
    return lines


def mode_row(name: str, runs: list[RunResult]) -> tuple[str, float]:
    ttfts = [t for r in runs for t in r.chat_ttft_s]
    gaps = [g for r in runs for gs in r.chat_gaps_s for g in gs]
    met = [meets_slo(TARGETS, t, gs) for r in runs for t, gs in zip(r.chat_ttft_s, r.chat_gaps_s, strict=True)]
    att = attainment(met, sum(r.span_s for r in runs))
    ttft_p99 = nearest_rank(ttfts, 0.99)
    doc = [r.doc_tok_per_s for r in runs]
    row = (
        f"{name:>10} | {len(ttfts):>5} | {nearest_rank(ttfts, 0.5):>9.3f} | {ttft_p99:>9.3f} | "
        f"{gap_quantile_s(gaps) or 0.0:>8.3f} | {att.fraction:>10.1%} | {att.goodput_per_s:>8.2f} | "
        f"{statistics.median(doc):>8.0f} ({min(doc):.0f}-{max(doc):.0f})"
    )
    return row, ttft_p99


def report(results: dict[str, list[RunResult]], fit_state: dict[str, Any] | None) -> None:
    """`results`: the plugin's runs first, then those of the server it is compared with."""
    mine, other = list(results)
    timed = [t for r in results[mine] for t in r.timed_passes]
    print(f"\n(a) The online pass-cost fit, {len(timed)} passes timed during the measured runs (fairshare server)")
    for line in fit_table(timed):
        print(line)
    if timed:
        error = statistics.median(relative_misses(timed))
        verdict = "met" if error <= FIT_ERROR_TARGET else "missed"
        floor, _ = noise_floor(timed)
        if verdict == "missed" and floor is not None and floor > FIT_ERROR_TARGET:
            verdict += f" (the passes' noise floor is {floor:.1%}: no model of their figures meets it)"
        print(f"median abs error {error:.1%} (target <= {FIT_ERROR_TARGET:.0%}): {verdict}")
    if fit_state is not None:
        print(
            f"error the fit states at the end (the SLO sizer's margin on each predicted pass): "
            f"{fit_state['relative_error']:.1%}"
        )
        print(f"fitted model at the end (/server_info): {fit_state}")

    print(
        f"\n(b) Chats during documents; targets TTFT p99 <= {TARGETS.ttft_s} s, TBT p99 <= {TARGETS.tbt_s} s "
        "(nearest rank over every chat of the mode)"
    )
    print(
        f"{'mode':>10} | {'chats':>5} | {'TTFT p50':>9} | {'TTFT p99':>9} | {'TBT p99':>8} | "
        f"{'attainment':>10} | {'goodput':>8} | doc prefill tok/s, median (min-max)"
    )
    p99 = {}
    for name in results:
        row, p99[name] = mode_row(name, results[name])
        print(row)
    ratios = [a.doc_tok_per_s / b.doc_tok_per_s for a, b in zip(results[mine], results[other], strict=True)]
    print(
        f"document throughput {mine} / {other}: {statistics.median(ratios):.3f} "
        f"(per-run ratios {min(ratios):.3f}-{max(ratios):.3f})"
    )
    for name in results:
        verdict = "met" if p99[name] <= TARGETS.ttft_s else f"missed by {p99[name] - TARGETS.ttft_s:.2f} s"
        print(f"{name}: chat TTFT p99 {p99[name]:.3f} s against {TARGETS.ttft_s} s: {verdict}")


def policy_knobs(pairs: list[str], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` pairs as policy knobs (`PolicyConfig` fields; ``none`` for None), each server's
    ``FAIRSHARE_<KEY>``; checked as the plugin will read them (`explicit_policy_env`, then the whole config's
    checks): a bad one is a `ValueError` naming it."""
    knobs = dict(pair.partition("=")[::2] for pair in pairs)
    for key, value in knobs.items():
        if key not in PolicyConfig.model_fields or not value:
            raise ValueError(f"{flag} {key}={value}: not KEY=VALUE with KEY a PolicyConfig field")
    try:
        PolicyConfig(**explicit_policy_env({env_var_name(k): v for k, v in knobs.items()}))
    except ValidationError as e:
        raise ValueError(f"{flag}: {e}") from None
    return knobs


def server_envs(trace: Path, policy: dict[str, str], against: dict[str, str] | None) -> dict[str, dict[str, str]]:
    """Each server's environment: the plugin with `policy` (its pass trace on), and upstream, or with `against`
    the plugin with `policy` changed by it."""
    mine = cpu_sglang_env(pass_trace=trace, **policy)
    if against is None:
        return {"fairshare": mine, "upstream": cpu_sglang_env(plugin_enabled=False)}
    return {"fairshare": mine, BASELINE: cpu_sglang_env(**{**policy, **against})}


def start_servers(
    model_dir: Path, work: Path, policy: dict[str, str], against: dict[str, str] | None
) -> dict[str, Server]:
    servers: dict[str, Server] = {}
    trace = work / TRACE_NAME
    try:
        for name, env in server_envs(trace, policy, against).items():
            server = LocalServer(model_dir, [*CPU_SERVER_ARGS, *SERVER_ARGS], env, work / f"{name}.log")
            server.start()
            servers[name] = (server, trace if name == "fairshare" else None)
    except BaseException:
        for server, _ in servers.values():
            server.stop()
        raise
    return servers


RESULTS = (
    "slo-sglang",
    "Real sglang on CPU: chat TTFT during documents and the online pass-cost fit, against upstream",
)
RESULTS_AGAINST = (
    "slo-sglang-against",
    "Real sglang on CPU: chat TTFT during documents, the plugin against itself with one policy knob changed",
)
"""Where runs are recorded: `--against` runs in a folder of their own, so the latest against upstream stays there."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="measured runs per mode (after one warm-up run each)")
    parser.add_argument("--keep", type=Path, help="keep the servers' logs and the pass trace in this folder")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a policy knob of the plugin's server"
    )
    parser.add_argument(
        "--against",
        action="append",
        metavar="KEY=VALUE",
        help=f"compare with the plugin under the same policy but this knob (repeatable), the server named "
        f"{BASELINE!r}, instead of upstream",
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: must be >= 1")
    try:
        policy = policy_knobs(args.set, "--set")
        against = None if args.against is None else policy_knobs(args.against, "--against")
    except ValueError as e:
        parser.error(str(e))
    with recording(*(RESULTS if against is None else RESULTS_AGAINST)):
        with tempfile.TemporaryDirectory(prefix="slo-sglang-") as tmp:
            work = Path(tmp) if args.keep is None else args.keep
            work.mkdir(parents=True, exist_ok=True)
            model_dir = build_tiny_model(work / "model", MODEL)
            servers = start_servers(model_dir, work, policy, against)
            try:
                results, fit_state = measure(servers, args.runs)
            finally:
                for server, _ in servers.values():
                    server.stop()
        report(results, fit_state)


def measure(servers: dict[str, Server], runs: int) -> tuple[dict[str, list[RunResult]], Any]:
    modes = list(servers)
    results: dict[str, list[RunResult]] = {name: [] for name in modes}
    for name in modes:  # warm-up: caches, and the first passes the fit learns from
        one_run(servers[name][0], f"warmup-{name}", schedule(10_000), seed=10_000)
    for run in range(runs):
        plan = schedule(run)
        print(f"run {run}: document {plan.doc_tokens} tokens, {len(plan.chat_offsets_s)} chats", flush=True)
        for name in modes if run % 2 == 0 else reversed(modes):
            server, trace = servers[name]
            before = len(read_pass_timings(trace)) if trace is not None else 0
            result = one_run(server, f"{name}-{run}", plan, seed=run + 1)
            if trace is not None:
                result.timed_passes = read_pass_timings(trace)[before:]
            results[name].append(result)
    info = servers["fairshare"][0].request("GET", "/server_info")
    state = (info.get("internal_states") or [{}])[0].get("fairshare", {})
    return results, state.get("pass_cost")


if __name__ == "__main__":
    main()
