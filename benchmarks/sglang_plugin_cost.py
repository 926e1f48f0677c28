"""The plugin's cost inside sglang's scheduler loop: decode throughput with the plugin on and off.

Real sglang servers (``python -m sglang.launch_server``) serve the same model side by side: ``on``, the plugin as
deployed; ``clocked``, the plugin with its own time per pass recorded (``FAIRSHARE_PLUGIN_CLOCK``: an instrument,
which costs a few microseconds per pass itself, so it runs in a server of its own); ``off``, with
``FAIRSHARE_PLUGIN_ENABLED=0`` (upstream sglang); ``off-clocked``, upstream with its prefill scheduling call
(`_get_new_batch_prefill_raw`, where the plugin plans) timed by the same clock, and otherwise unchanged: the clocked
calls' difference, plus the plugin's clocked work outside that call (where each pass's launch returns and its result
lands: the pass timed and fed to the online pass-cost fit, decode-only passes included), is what the plugin adds to
an iteration, measured where the noise of a
shared machine hardly reaches it (runs of identical servers differ by a few percent in rate here; the median of
thousands of clocked calls hardly moves), and ``off-clocked``'s rate against ``off`` shows the rate's noise in the
same run. Everything but the policy is equal: the plugin turns sglang's mixed chunk on by default
(``FAIRSHARE_MIXED_DECODE``), so the upstream server gets ``--enable-mixed-chunk`` too. With ``--before-ref REF``
another server runs the plugin as committed at git REF (``git archive`` of ``scheduler/``, clocked), so a change's
before and after are measured in one run. Runs alternate between them (on, clocked, off-clocked, off, on, ...; the
order rotates).

In each run one stream decodes while the case's waiting requests sit in the queue, none of which fits in the KV
the stream leaves free:

- ``lone``: nothing waits;
- ``rejected``: one request waits, rejected for KV capacity (the issue's case);
- ``queue100`` / ``queue1000``: 100 / 1,000 requests wait, all too big for the free KV.

A run measures the stream's decode rate over `--window` tokens once every waiting request is queued (sglang's own
streamed output, one token per scheduler iteration), then aborts everything, waits for the server to go idle and
lets the servers settle; the order of the modes rotates from run to run. Printed per case: decode tok/s per mode
and off (median and min-max over runs), the ratio of the medians to off (target >= 98%) with a bootstrap
interval and the verdict read from it (met / missed / unresolved), both for the rate over the window and for the
steady rate (`steady_rate`: at the median gap between tokens, which the stalls of a shared machine do not move:
runs of identical servers differ by a few percent over the window here). Then the cost per iteration: the
scheduler loop's CPU time per decoded token (one scheduler iteration; the kernel's count for the scheduler's main
thread), per mode and off, and, from the clocked server, the plugin's own time per iteration inside the scheduler
process, its work outside the prefill call included (median and p90 over every pass of the case's runs; target
<= 100 us with nothing admissible), the whole
`_get_new_batch_prefill_raw` call it wraps (upstream's adder and scan included: upstream itself returns at once
while ``batch_is_full``), and how the passes were planned (`PassKind`: without an adder, replayed in one, on a
queue walk, not planned), and upstream's own call, from ``off-clocked``. Last, what the plugin adds per iteration: the
median of its call plus its work outside it, less the median of upstream's call, as a share of upstream's scheduler
CPU per iteration, and the on/off ratio that share alone allows. Beside each rate ratio: the runs per mode an
interval of +-1% would take at this run's spread (`runs_to_resolve`).

On a machine without a GPU it runs sglang on CPU with a tiny random-weight model built locally (the test
infrastructure's `sgl_kernel` stand-in and CPU switches); with ``--device cuda`` the same script runs on a GPU.

    python -m benchmarks.sglang_plugin_cost --quick          # CI scale: 5 runs per mode and case
    python -m benchmarks.sglang_plugin_cost --runs 7 --window 600
    python -m benchmarks.sglang_plugin_cost --quick --before-ref main   # the plugin before this branch, too
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import json
import math
import os
import random
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.net import http_json
from harness.results import records
from harness.sglang_server import LocalServer
from harness.tiny_model import TinyModelSpec, build_tiny_model
from scheduler.sglang_plugin.clock import ClockPass, PassKind, read_clock

REPO = Path(__file__).resolve().parents[1]

POOL_TOKENS = 5000
STREAM_PROMPT = 2600
"""With the stream's prompt in KV, at most 2,399 tokens are free: a waiting request of `WAITING_PROMPT` never fits."""
WAITING_PROMPT = 2500
QUEUED_PROMPT, QUEUED_MAX_NEW = 16, 3000
"""Behind the 2,500-token request, the long queues hold short prompts that reserve a long output: each needs
more KV than is free as well, and a queue of 1,000 is sent and queued in seconds."""
STREAM_MAX_NEW = 2000
CASES = {"lone": 0, "rejected": 1, "queue100": 100, "queue1000": 1000}
FIRST_WORD_ID = 5
SETTLE_S = 1.0
TARGET_RATIO = 0.98
"""Decode throughput with the plugin on, as a share of off (the issue's acceptance)."""
CONFIDENCE, BOOTSTRAP_RESAMPLES = 0.9, 2000
RESOLUTION = 0.01
"""The half-width of an interval that tells a 97% ratio from 99%: the runs per mode it would take are printed."""
VOCAB = TinyModelSpec().vocab_size


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(FIRST_WORD_ID, VOCAB) for _ in range(n)]


def server_args(device: str) -> list[str]:
    common = [
        "--max-total-tokens",
        str(POOL_TOKENS),
        "--chunked-prefill-size",
        "1024",
        "--max-running-requests",
        "8",
        "--log-level",
        "warning",
        "--enable-mixed-chunk",  # what the plugin turns on by default: the upstream server runs it too
    ]
    if device == "cpu":
        from harness.cpu_env import CPU_SERVER_ARGS

        return [*CPU_SERVER_ARGS, *common]
    return common


def server_env(device: str, code: Path | None = None, **fairshare: object) -> dict[str, str]:
    """The server's environment; `code`: a directory whose ``scheduler`` package the server imports first."""
    if device == "cpu":
        from harness.cpu_env import cpu_sglang_env

        env = cpu_sglang_env(**fairshare)
    else:
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("FAIRSHARE_")}
        env.update({f"FAIRSHARE_{k.upper()}": str(v) for k, v in fairshare.items()})
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH", "")]))
    return env


def export_scheduler(ref: str, into: Path) -> Path:
    """The ``scheduler`` package as committed at git `ref`, extracted under `into`."""
    into.mkdir(parents=True)
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", ref, "scheduler"], check=True, capture_output=True
        ).stdout
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"--before-ref {ref}: git archive failed: {e.stderr.decode().strip()}") from None
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def load(port: int) -> dict:
    (rank0,) = http_json(port, "GET", "/v1/loads")["loads"]
    return rank0


def wait_until(what: str, check, timeout_s: float = 300, poll_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


class Stream(threading.Thread):
    """A streamed ``/generate``: the arrival time and the completion-token count of every chunk."""

    def __init__(self, port: int, rid: str, prompt: list[int]) -> None:
        super().__init__(daemon=True, name=rid)
        self.port, self.rid, self.prompt = port, rid, prompt
        self.chunks: list[tuple[float, int]] = []
        self.error: str | None = None
        self.start()

    def run(self) -> None:
        body = {
            "rid": self.rid,
            "input_ids": self.prompt,
            "stream": True,
            "sampling_params": {"max_new_tokens": STREAM_MAX_NEW, "temperature": 0.0, "ignore_eos": True},
        }
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            conn.request("POST", "/generate", body=json.dumps(body), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                self.chunks.append((time.perf_counter(), json.loads(line[5:])["meta_info"]["completion_tokens"]))
        except Exception as e:  # reported by the run
            self.error = repr(e)
        finally:
            conn.close()

    def tokens(self) -> int:
        return self.chunks[-1][1] if self.chunks else 0


class Batch(threading.Thread):
    """The waiting requests, sent as one batched ``/generate`` (sglang queues them together); aborted later."""

    def __init__(self, port: int, run_id: str, n: int, seed: int) -> None:
        super().__init__(daemon=True, name=f"{run_id}-waiting")
        rng = random.Random(seed)
        prompts = [ids(WAITING_PROMPT, seed)] + [ids(QUEUED_PROMPT, rng.randrange(1 << 30)) for _ in range(n - 1)]
        self.body = {
            "rid": [f"{run_id}-w{i}" for i in range(n)],
            "input_ids": prompts,
            "sampling_params": [{"max_new_tokens": 16, "temperature": 0.0}]
            + [{"max_new_tokens": QUEUED_MAX_NEW, "temperature": 0.0}] * (n - 1),
        }
        self.port = port
        self.start()

    def run(self) -> None:
        # Aborted requests may answer with an error status; the run checks the queue itself.
        with contextlib.suppress(Exception):
            http_json(self.port, "POST", "/generate", self.body, timeout_s=900)


@dataclass
class Mode:
    name: str
    server: LocalServer
    clock: Path | None
    clock_line: int = 0
    rates: dict[str, list[float]] = field(default_factory=dict)
    steady: dict[str, list[float]] = field(default_factory=dict)
    """`steady_rate` per run."""
    cpu_us: dict[str, list[float]] = field(default_factory=dict)
    """The scheduler loop's CPU time per decoded token (one scheduler iteration), per run."""
    passes: dict[str, list[ClockPass]] = field(default_factory=dict)


def scheduler_pid(server: LocalServer) -> int:
    """The scheduler process of `server` (sglang titles it ``sglang::scheduler``), in the server's process group."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry.name)) == server.proc.pid and (entry / "comm").read_text().startswith(
                    "sglang::sched"
                ):
                    return int(entry.name)
    raise RuntimeError("no sglang::scheduler process in the server's process group")


def thread_cpu_ns(pid: int) -> int:
    """CPU time of the process's main thread (the scheduler loop), from the kernel's schedstat (ns)."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0])


def steady_rate(chunks: list[tuple[float, int]]) -> float:
    """Tokens per second at the median gap between tokens: the rate of a typical scheduler iteration, which a
    stall of the machine (another process taking the core for milliseconds) does not move."""
    gaps = [(t1 - t0) / (c1 - c0) for (t0, c0), (t1, c1) in itertools.pairwise(chunks) if c1 > c0]
    return 1 / statistics.median(gaps)


@dataclass(frozen=True)
class Measured:
    """A stream's measured window: its chunks (the one before the window first) and the scheduler loop's CPU us per
    decoded token over it."""

    chunks: list[tuple[float, int]]
    cpu_us_per_token: float

    @property
    def tokens(self) -> int:
        return self.chunks[-1][1] - self.chunks[0][1]

    @property
    def seconds(self) -> float:
        return self.chunks[-1][0] - self.chunks[0][0]


class Window:
    """A measured window of `stream`'s decoding, opened now: `measure` waits for its end."""

    def __init__(self, stream: Stream, pid: int) -> None:
        self.stream, self.pid = stream, pid
        self.start_line = len(stream.chunks)
        self.first, self.cpu0 = stream.tokens(), thread_cpu_ns(pid)

    def measure(self, window: int, run_id: str) -> Measured:
        """Once `window` more tokens have come (or the stream ended: a `RuntimeError` if it ended short)."""
        stream = self.stream
        wait_until("the measured window", lambda: stream.tokens() >= self.first + window or not stream.is_alive(), 900)
        last, cpu1 = stream.tokens(), thread_cpu_ns(self.pid)
        measured = Measured(stream.chunks[self.start_line - 1 :], (cpu1 - self.cpu0) / 1e3 / max(1, last - self.first))
        if stream.error or measured.tokens < window:
            raise RuntimeError(f"{run_id}: the stream ended early ({measured.tokens} tokens; {stream.error})")
        return measured


def one_run(mode: Mode, case: str, run: int, window: int) -> tuple[float, float, float]:
    """Decode tok/s of one stream while the case's requests wait (over the window, and `steady_rate`), and the
    scheduler loop's CPU us per decoded token; leaves the server idle."""
    port = mode.server.port
    n_waiting = CASES[case]
    run_id = f"{case}-{mode.name}-{run}"
    stream = Stream(port, f"{run_id}-stream", ids(STREAM_PROMPT, seed=1000 + run))
    wait_until("the stream's first tokens", lambda: stream.tokens() >= 2 or stream.error)
    batch = Batch(port, run_id, n_waiting, seed=run) if n_waiting else None
    if n_waiting:
        wait_until(
            f"{n_waiting} waiting requests",
            lambda: load(port)["num_waiting_reqs"] >= n_waiting or stream.error or not stream.is_alive(),
        )
    measured = Window(stream, scheduler_pid(mode.server)).measure(window, run_id)
    assert load(port)["num_waiting_reqs"] == n_waiting, "a waiting request was admitted: the case is wrong"
    http_json(port, "POST", "/abort_request", {"rid": "", "abort_all": True})
    stream.join(120)
    if batch is not None:
        batch.join(300)
    wait_until("the server to go idle", lambda: (s := load(port))["num_running_reqs"] + s["num_waiting_reqs"] == 0)
    return measured.tokens / measured.seconds, steady_rate(measured.chunks), measured.cpu_us_per_token


def collect_clock(mode: Mode, case: str) -> None:
    # Both modes settle alike before the next run (the other server may still be cleaning up an abort), and
    # the clock flushes at least every 0.5 s while passes run.
    time.sleep(SETTLE_S)
    if mode.clock is None:
        return
    passes, mode.clock_line = read_clock(mode.clock, mode.clock_line)
    mode.passes.setdefault(case, []).extend(passes)


def spread(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    v = [x * scale for x in values]
    return f"{statistics.median(v):.{digits}f} ({min(v):.{digits}f}-{max(v):.{digits}f})"


def ratio_interval(rates: list[float], rates_off: list[float]) -> tuple[float, float]:
    """A bootstrap `CONFIDENCE` interval of median(rates) / median(rates_off): the runs of each mode resampled
    (fixed seed). How far the printed ratio can be trusted on this machine, whose noise is a few percent per run."""
    rng = random.Random(0)
    ratios = [
        statistics.median(rng.choices(rates, k=len(rates)))
        / statistics.median(rng.choices(rates_off, k=len(rates_off)))
        for _ in range(BOOTSTRAP_RESAMPLES)
    ]
    tail = (1 - CONFIDENCE) / 2
    return percentile(ratios, tail), percentile(ratios, 1 - tail)


def verdict(low: float, high: float) -> str:
    """The throughput target, judged on the interval: met or missed only where the whole interval says so."""
    if low >= TARGET_RATIO:
        return "met"
    return "missed" if high < TARGET_RATIO else "unresolved"


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def pass_mix(passes: list[ClockPass]) -> str:
    """How the case's passes were planned: without an adder / replayed in one / on a queue walk / not at all."""
    if any(p.kind is None for p in passes):
        return "-"  # an older plugin's clock
    counts = {kind: 0 for kind in PassKind}
    for p in passes:
        counts[p.kind] += 1
    return "/".join(str(counts[k]) for k in (PassKind.IDLE, PassKind.REPLAY, PassKind.SCAN, PassKind.NONE))


def iteration_ns(p: ClockPass) -> int:
    """What the plugin spent in one scheduler iteration: its sections in the prefill call and its work outside it
    (where the pass's launch returned and its result landed; an older plugin's clock did not time that)."""
    return p.ns + (p.outside_ns or 0)


def clock_columns(passes: list[ClockPass]) -> tuple[str, str, str]:
    """The plugin's own us per iteration (median, p90, mean), the whole call's (median, p90, mean), the pass mix."""
    if not passes:
        return "-", "-", "-"
    own = med_p90_mean([iteration_ns(p) for p in passes])
    calls = [p.call_ns for p in passes if p.call_ns is not None]
    return own, med_p90_mean(calls) if calls else "-", pass_mix(passes)


def med_p90_mean(ns: list[int]) -> str:
    """Nanoseconds as microseconds: the median, the 90th percentile and the mean."""
    return ", ".join(f"{x / 1e3:.1f}" for x in (statistics.median(ns), percentile(ns, 0.9), statistics.mean(ns)))


def runs_to_resolve(low: float, high: float, runs: int) -> int:
    """Runs per mode for an interval of +-`RESOLUTION` (what resolves a ratio `RESOLUTION` off the 98% target), from
    one of `runs` runs as wide as [low, high]: an interval of medians narrows as 1 / sqrt(runs)."""
    return max(runs, math.ceil(runs * ((high - low) / 2 / RESOLUTION) ** 2))


def ratio_columns(rates: list[float], rates_off: list[float]) -> str:
    """Median (min-max) tok/s of a mode and of off, the ratio of the medians, its interval, the verdict, and the runs
    an interval of +-`RESOLUTION` would take."""
    ratio = statistics.median(rates) / statistics.median(rates_off)
    low, high = ratio_interval(rates, rates_off)
    return (
        f"{spread(rates):>20} | {spread(rates_off):>20} | {ratio:6.1%} | {f'{low:.1%}-{high:.1%}':>13} | "
        f"{verdict(low, high):>10} | {runs_to_resolve(low, high, min(len(rates), len(rates_off))):>6}"
    )


def added_per_iteration(mode: Mode, upstream: Mode, off: Mode, case: str) -> tuple[float, float, float] | None:
    """What the plugin adds to one scheduler iteration: its `_get_new_batch_prefill_raw` call plus its work outside
    the call (where each pass's launch returned and its result landed) less upstream's call (us; one call per
    iteration), as medians and as means, and upstream's iteration (its scheduler CPU per decoded token, us). The
    median is a steady pass, which a preempted call does not move; the mean is every pass (what a window's iterations
    add up to: the fit's batched catch-up every `MAX_HELD` passes and the rescans included), and a bound from above,
    since the clock's sections also count a preemption. None without both clocks' calls."""
    calls = [p.call_ns + (p.outside_ns or 0) for p in mode.passes.get(case, []) if p.call_ns is not None]
    upstream_calls = [p.call_ns for p in upstream.passes.get(case, [])]
    if not calls or not upstream_calls:
        return None
    median_us = (statistics.median(calls) - statistics.median(upstream_calls)) / 1e3
    mean_us = (statistics.mean(calls) - statistics.mean(upstream_calls)) / 1e3
    return median_us, mean_us, statistics.median(off.cpu_us[case])


def report(modes: list[Mode], off: Mode, upstream: Mode, cases: list[str]) -> None:
    """Per case and mode: its decode rate against upstream's (the same case's interleaved runs), over the window
    and steady; then the cost per iteration: scheduler CPU and the clocks; then what the plugin adds to an
    iteration, from the clocked calls (`upstream`: the upstream server whose call is clocked)."""
    print(f"\nmachine load now (1-min average): {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    interval, target = f"{CONFIDENCE:.0%} CI", f">={TARGET_RATIO:.0%}"
    runs_head = f"runs \u00b1{RESOLUTION:.0%}"
    rate_head = f"{'tok/s':>20} | {'off: tok/s':>20} | {'/off':>6} | {interval:>13} | {target:>10} | {runs_head:>6}"
    print(f"{'case':>10} | {'mode':>11} | {rate_head} | steady: {rate_head}")
    for case in cases:
        for mode in modes:
            print(
                f"{case:>10} | {mode.name:>11} | {ratio_columns(mode.rates[case], off.rates[case])} | "
                f"        {ratio_columns(mode.steady[case], off.steady[case])}"
            )
    print(
        f"\n{'case':>10} | {'mode':>11} | {'CPU us/iter':>20} | {'off: CPU us/iter':>20} | {'CPU +us':>7} | "
        f"{'plugin us/iter med, p90, mean':>30} | {'call us/pass med, p90, mean':>28} | passes idle/replay/scan/none"
    )
    for case in cases:
        for mode in modes:
            own, call, mix = clock_columns(mode.passes.get(case, []))
            cpu, cpu_off = mode.cpu_us[case], off.cpu_us[case]
            extra = statistics.median(cpu) - statistics.median(cpu_off)
            print(
                f"{case:>10} | {mode.name:>11} | {spread(cpu, digits=0):>20} | {spread(cpu_off, digits=0):>20} | "
                f"{extra:7.0f} | {own:>30} | {call:>28} | {mix}"
            )
    print(
        f"\n{'case':>10} | {'mode':>11} | {'plugin +us/iter med':>19} | {'mean':>6} | {'of upstream iter':>16} | "
        f"{'on/off that allows':>18}   (the plugin's call and its work outside it less upstream's call: median, mean)"
    )
    for case in cases:
        for mode in modes:
            if mode is not upstream and (added := added_per_iteration(mode, upstream, off, case)) is not None:
                median_us, mean_us, upstream_us = added
                shares = f"{median_us / upstream_us:.2%}, {mean_us / upstream_us:.2%}"
                allows = f"{upstream_us / (upstream_us + median_us):.1%}, {upstream_us / (upstream_us + mean_us):.1%}"
                print(
                    f"{case:>10} | {mode.name:>11} | {median_us:19.1f} | {mean_us:6.1f} | {shares:>16} | {allows:>18}"
                )
    print(
        f"target: on/off >= {TARGET_RATIO:.0%} in every case (judged on the {CONFIDENCE:.0%} bootstrap interval: "
        "'unresolved' where it spans the target; more runs narrow it); plugin time per pass <= 100 us with nothing "
        "admissible (clocked)",
        flush=True,
    )


@records("sglang-plugin-cost", "The plugin's cost inside sglang's scheduler loop (real sglang on CPU, plugin on/off)")
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI scale: 5 runs per mode and case, 200-token window")
    parser.add_argument("--runs", type=int, default=None, help="runs per mode and case (at least 5)")
    parser.add_argument("--window", type=int, default=None, help="decode tokens measured per run")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {', '.join(CASES)}")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--model-path", type=Path, default=None, help="default: a tiny random Llama built here")
    parser.add_argument("--before-ref", default=None, help="also run the plugin as committed at this git ref")
    args = parser.parse_args()
    runs = args.runs or 5
    window = args.window or (200 if args.quick else 600)
    cases = args.cases.split(",")
    if unknown := [c for c in cases if c not in CASES]:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    if runs < 5:
        parser.error(f"--runs {runs}: at least 5 runs per mode are needed for a median and spread")
    if window + 2 >= STREAM_MAX_NEW:
        parser.error(f"--window {window}: must be below {STREAM_MAX_NEW - 2} (the stream's length)")

    with tempfile.TemporaryDirectory(prefix="plugin-cost-") as tmp, contextlib.ExitStack() as servers:
        tmp_path = Path(tmp)
        before = export_scheduler(args.before_ref, tmp_path / "before") if args.before_ref else None
        model = args.model_path or build_tiny_model(tmp_path / "model", TinyModelSpec())
        args_ = server_args(args.device)
        print(f"starting sglang servers ({args.device}); machine load {os.getloadavg()[0]:.1f}", flush=True)

        def start(name: str, clocked: bool, code: Path | None = None, **fairshare: object) -> Mode:
            # `code`'s scheduler package must come first on the server's path: ``python -m`` puts the working
            # directory there, ahead of PYTHONPATH, so the server runs in `code`.
            clock = tmp_path / f"{name}.jsonl" if clocked else None
            env = server_env(args.device, code=code, **fairshare, **({"plugin_clock": clock} if clocked else {}))
            server = LocalServer(model, args_, env, tmp_path / f"{name}.log", startup_timeout_s=900, cwd=code)
            return Mode(name, servers.enter_context(server), clock)

        plugin_modes = [start("on", clocked=False), start("clocked", clocked=True)]
        if before is not None:
            plugin_modes.append(start("before", clocked=True, code=before))
        upstream_clocked = start("off-clocked", clocked=True, plugin_enabled=0)
        off = start("off", clocked=False, plugin_enabled=0)
        compared = [*plugin_modes, upstream_clocked]
        modes = [*compared, off]
        done = []
        for case in cases:
            for mode in compared:
                collect_clock(mode, case)  # passes before the case (warm-up, idle) are not the case's
                mode.passes.pop(case, None)
            try:
                for run in range(runs):
                    k = run % len(modes)
                    for mode in modes[k:] + modes[:k]:  # none always goes first
                        rate, steady, cpu = one_run(mode, case, run, window)
                        mode.rates.setdefault(case, []).append(rate)
                        mode.steady.setdefault(case, []).append(steady)
                        mode.cpu_us.setdefault(case, []).append(cpu)
                        collect_clock(mode, case)
            except (RuntimeError, TimeoutError) as e:
                print(f"{case}: failed ({e}); the other cases go on", flush=True)
                continue
            done.append(case)
            report(compared, off, upstream_clocked, [case])
        report(compared, off, upstream_clocked, done)


if __name__ == "__main__":
    main()
