"""The plugin on against off, in pairs run at the same time: a decoding stream's cost per token in the issue's scenario.

One stream decodes while a document waits, rejected for KV capacity, and a short question arrives a third of the
way into the measured window. Two real sglang servers serve the same tiny model, one with the plugin on and one
off (upstream sglang, with the plugin's `--enable-mixed-chunk`), and run the scenario *at the same time*, each
server's processes pinned to a core of its own; the next pair swaps the cores. A machine shared with other work
drifts by tens of percent over seconds (runs one after the other differ by 0.86-1.29x here), and a pair run
together sees the same drift, so the ratio within a pair is what the plugin costs, and swapping cores cancels a
difference between the two cores.

A server started once runs a few percent faster or slower than another started the same way, for its whole life:
runs of this benchmark on one start of the servers each, on the same code, read medians of 1.099 and 0.994, each
interval far narrower than that (CHANGELOG, 2026-12-04). Pairs on the same two servers share that difference, so
the servers are started afresh every ``--per-round`` pairs, and the interval is a bootstrap over rounds (a round's
pairs are resampled together): it spans the servers' own spread as well as the pairs'. ``--upstream-both`` runs
two upstream servers against each other: what the method reads where there is nothing to find (recorded in a
results folder of its own, ``sglang-plugin-pairs-upstream-both``).

Printed per pair and as medians with a bootstrap interval: the stream's wall milliseconds per token on against
off, the scheduler loop's CPU per iteration on against off (the kernel's count for the scheduler's main thread:
the figure the other processes on the core move least), and the question's time to first token on and off (the
plugin lets it skip ahead of the waiting document; upstream keeps it behind).

    python -m benchmarks.sglang_plugin_pairs                      # 32 pairs in 8 rounds: about 8 minutes on 2 CPUs
    python -m benchmarks.sglang_plugin_pairs --quick              # 4 pairs in 2 rounds, a shorter window

On a machine with fewer than two cores the servers share one.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import http.client
import json
import os
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from benchmarks.sglang_plugin_cost import (
    STREAM_PROMPT,
    Batch,
    Stream,
    Window,
    ids,
    load,
    percentile,
    scheduler_pid,
    server_args,
    server_env,
    wait_until,
)
from harness.net import http_json
from harness.results import recording
from harness.sglang_server import LocalServer
from harness.tiny_model import TinyModelSpec, build_tiny_model

TARGET_RATIO = 1.02
"""On against off, at most (the stream's time per token, the median of the pairs)."""
QUESTION_PROMPT, QUESTION_TOKENS = 30, 4
CONFIDENCE, BOOTSTRAP_RESAMPLES = 0.9, 2000


@dataclass(frozen=True)
class Run:
    ms_per_token: float
    cpu_us_per_iteration: float
    question_ttft_s: float


def group_pids(server: LocalServer) -> list[int]:
    """Every process of `server`'s process group (the launcher, tokenizer, scheduler, detokenizer)."""
    assert server.proc is not None
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry.name)) == server.proc.pid:
                    pids.append(int(entry.name))
    return pids


def pin(server: LocalServer, cpu: int) -> None:
    """Every thread of every process of `server` onto `cpu` (threads started later inherit it)."""
    for pid in group_pids(server):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(task.name), {cpu})


def ask(port: int, rid: str) -> float:
    """A short streamed question; seconds to its first token."""
    body = {
        "rid": rid,
        "input_ids": ids(QUESTION_PROMPT, seed=77),
        "stream": True,
        "sampling_params": {"max_new_tokens": QUESTION_TOKENS, "temperature": 0.0},
    }
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    try:
        conn.request("POST", "/generate", body=json.dumps(body), headers={"Content-Type": "application/json"})
        for raw in conn.getresponse():
            if raw.startswith(b"data:") and raw.strip() != b"data: [DONE]":
                return time.perf_counter() - started
    finally:
        conn.close()
    raise RuntimeError(f"{rid}: no token")


def one_run(server: LocalServer, run_id: str, seed: int, window: int) -> Run:
    """The scenario once on `server`; leaves it idle. The question's answer may come after the window (upstream
    admits it only once the stream is aborted): its first token is awaited after the abort."""
    port = server.port
    stream = Stream(port, f"{run_id}-stream", ids(STREAM_PROMPT, seed=1000 + seed))
    wait_until("the stream's first tokens", lambda: stream.tokens() >= 2 or stream.error)
    waiting = Batch(port, run_id, 1, seed=seed)
    wait_until("the waiting document", lambda: load(port)["num_waiting_reqs"] >= 1)
    measuring = Window(stream, scheduler_pid(server))
    question: dict[str, float] = {}

    def ask_midway() -> None:
        third = measuring.first + window // 3
        wait_until("a third of the window", lambda: stream.tokens() >= third or not stream.is_alive())
        question["ttft_s"] = ask(port, f"{run_id}-question")

    asker = threading.Thread(target=ask_midway, daemon=True)
    asker.start()
    measured = measuring.measure(window, run_id)
    http_json(port, "POST", "/abort_request", {"rid": f"{run_id}-stream"})
    asker.join(300)
    http_json(port, "POST", "/abort_request", {"rid": "", "abort_all": True})
    stream.join(120)
    waiting.join(300)
    wait_until("the server to go idle", lambda: (s := load(port))["num_running_reqs"] + s["num_waiting_reqs"] == 0)
    if "ttft_s" not in question:
        raise RuntimeError(f"{run_id}: the question got no answer")
    return Run(measured.seconds * 1e3 / measured.tokens, measured.cpu_us_per_token, question["ttft_s"])


def pair(servers: dict[str, LocalServer], index: int, window: int) -> dict[str, Run]:
    """Both modes at once, each on its own core (swapped on odd pairs)."""
    cores = [0, 1] if (os.cpu_count() or 1) >= 2 else [0, 0]
    if index % 2:
        cores.reverse()
    for cpu, server in zip(cores, servers.values(), strict=True):
        pin(server, cpu)
    runs: dict[str, Run] = {}
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            runs[name] = one_run(servers[name], f"{name}-{index}", index, window)
        except BaseException as e:  # raised below, after both runs ended
            errors.append(e)

    threads = [threading.Thread(target=run, args=(name,)) for name in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return runs


def median_interval(rounds: list[list[float]]) -> tuple[float, float, float]:
    """The median of every round's values and a bootstrap `CONFIDENCE` interval of it (fixed seed) that resamples
    whole rounds (values measured on the same servers share their bias). With one round, its values are
    resampled one by one."""
    rng = random.Random(0)
    groups = rounds if len(rounds) > 1 else [[v] for v in rounds[0]]
    medians = [
        statistics.median([v for g in rng.choices(groups, k=len(groups)) for v in g])
        for _ in range(BOOTSTRAP_RESAMPLES)
    ]
    tail = (1 - CONFIDENCE) / 2
    return statistics.median([v for g in rounds for v in g]), percentile(medians, tail), percentile(medians, 1 - tail)


def verdict(low: float, high: float) -> str:
    """At most `TARGET_RATIO`, judged on the interval: met or missed only where the whole interval says so."""
    if high <= TARGET_RATIO:
        return "met"
    return "missed" if low > TARGET_RATIO else "unresolved"


class Sides(NamedTuple):
    """What the report calls the pair's two servers ("on" and "off" in `pair`'s runs) and its verdicts."""

    first: str
    second: str
    skip_ahead: bool
    """The first runs the plugin: whether the question skipped ahead is a finding (not in an A/A check)."""


PLUGIN_SIDES = Sides("on", "off", skip_ahead=True)
UPSTREAM_BOTH_SIDES = Sides("A", "B", skip_ahead=False)
"""An A/A check: both servers run upstream, and neither is the plugin."""


def report(rounds: list[list[dict[str, Run]]], sides: Sides = PLUGIN_SIDES) -> None:
    pairs = [p for r in rounds for p in r]
    a, b = sides.first, sides.second
    ratio = f"{a}/{b}"
    round_of_first_pair = [str(k) if j == 0 else "" for k, r in enumerate(rounds) for j in range(len(r))]
    print(
        f"\n{'round':>5} | {'pair':>4} | {f'{a} core':>7} | {f'ms/token {a}':>11} | {b:>6} | {ratio:>6} | "
        f"{f'CPU us/iter {a}':>14} | {b:>6} | {ratio:>6} | {f'question TTFT s {a}':>18} | {b:>6}"
    )
    for i, p in enumerate(pairs):
        on, off = p["on"], p["off"]
        print(
            f"{round_of_first_pair[i]:>5} | {i:>4} | {i % 2:>7} | {on.ms_per_token:11.3f} | {off.ms_per_token:6.3f} | "
            f"{on.ms_per_token / off.ms_per_token:6.3f} | {on.cpu_us_per_iteration:14.0f} | "
            f"{off.cpu_us_per_iteration:6.0f} | {on.cpu_us_per_iteration / off.cpu_us_per_iteration:6.3f} | "
            f"{on.question_ttft_s:18.3f} | {off.question_ttft_s:6.3f}"
        )
    interval = f"{CONFIDENCE:.0%} CI"
    print(f"\n{len(pairs)} pairs on {len(rounds)} starts of the two servers (the interval resamples whole starts)")
    print(f"{f'{ratio}, median of pairs':>32} | {'median':>6} | {interval:>13} | at most {TARGET_RATIO:.2f}")
    for name, field in (
        ("stream ms per token", "ms_per_token"),
        ("scheduler CPU per iteration", "cpu_us_per_iteration"),
    ):
        ratios = [[getattr(p["on"], field) / getattr(p["off"], field) for p in r] for r in rounds]
        mid, low, high = median_interval(ratios)
        print(f"{name:>32} | {mid:6.3f} | {f'{low:.3f}-{high:.3f}':>13} | {verdict(low, high)}")
    for key, name in (("on", a), ("off", b)):
        ttfts = [p[key].question_ttft_s for p in pairs]
        server = f"plugin {name}" if sides.skip_ahead else f"upstream {name}"
        print(f"question TTFT, {server:>10}: median {statistics.median(ttfts):.3f} s, max {max(ttfts):.3f} s")
    if sides.skip_ahead:
        skips = max(p["on"].question_ttft_s for p in pairs) < min(p["off"].question_ttft_s for p in pairs)
        print(f"the question skips ahead with the plugin on (its slowest first token before off's fastest): {skips}")


RESULTS = ("sglang-plugin-pairs", "The plugin on against off, in pairs run at the same time (real sglang on CPU)")
RESULTS_UPSTREAM_BOTH = (
    "sglang-plugin-pairs-upstream-both",
    "Two upstream sglang servers against each other, in pairs run at the same time: the pairs method's A/A check",
)
"""Where runs are recorded: the A/A check in a folder of its own, so the plugin's latest figures stay its own."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=32, help="pairs of runs in all (at least 4)")
    parser.add_argument("--per-round", type=int, default=4, help="pairs on one start of the two servers")
    parser.add_argument("--window", type=int, default=900, help="decode tokens measured per run")
    parser.add_argument("--quick", action="store_true", help="4 pairs of 300 tokens in 2 rounds")
    parser.add_argument(
        "--upstream-both", action="store_true", help="an A/A check: the 'on' server runs upstream too (plugin off)"
    )
    args = parser.parse_args()
    pairs_n, per_round, window = (4, 2, 300) if args.quick else (args.pairs, args.per_round, args.window)
    if pairs_n < 4:
        parser.error(f"--pairs {pairs_n}: at least 4 pairs are needed for a median and an interval")
    if not 1 <= per_round <= pairs_n:
        parser.error(f"--per-round {per_round}: between 1 and --pairs ({pairs_n})")
    if not 30 <= window <= 1500:
        parser.error(f"--window {window}: between 30 and 1500 decode tokens")
    with (
        recording(*(RESULTS_UPSTREAM_BOTH if args.upstream_both else RESULTS)),
        tempfile.TemporaryDirectory(prefix="plugin-pairs-") as tmp,
    ):
        tmp_path = Path(tmp)
        model = build_tiny_model(tmp_path / "model", TinyModelSpec())
        rounds: list[list[dict[str, Run]]] = []
        done = 0
        while done < pairs_n:
            print(f"round {len(rounds)}: starting both sglang servers (cpu); machine load {os.getloadavg()[0]:.1f}")
            with servers_started(model, tmp_path / f"round-{len(rounds)}", args.upstream_both) as servers:
                rounds.append([])
                for _ in range(min(per_round, pairs_n - done)):
                    rounds[-1].append(pair(servers, done, window))
                    done += 1
                    print(f"pair {done - 1} done; machine load {os.getloadavg()[0]:.1f}", flush=True)
        report(rounds, UPSTREAM_BOTH_SIDES if args.upstream_both else PLUGIN_SIDES)


@contextlib.contextmanager
def servers_started(model: Path, logs: Path, upstream_both: bool = False) -> Iterator[dict[str, LocalServer]]:
    """A fresh plugin-on and plugin-off server (`upstream_both`: two plugin-off servers), started at the same time;
    both stopped on leaving."""
    logs.mkdir(parents=True)
    off = server_env("cpu", plugin_enabled=0)
    envs = {"on": off if upstream_both else server_env("cpu"), "off": off}
    servers = {
        name: LocalServer(model, server_args("cpu"), env, logs / f"{name}.log", startup_timeout_s=900)
        for name, env in envs.items()
    }
    with contextlib.ExitStack() as stack:
        with concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:
            started = {name: pool.submit(s.start) for name, s in servers.items()}
            for name, future in started.items():
                if future.exception() is None:
                    stack.callback(servers[name].stop)
        for future in started.values():
            future.result()  # a server that failed to start: its error, the others stopped by the stack
        yield servers


if __name__ == "__main__":
    main()
