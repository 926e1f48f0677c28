"""An engine's compute beside each idle front: what a front's own CPU costs the engines on this machine.

    python -m benchmarks.compute_beside_fronts [--rounds 4] [--seconds 6]

Whether what a front runs beside its engines, even idle, slows their passes apart from any request. With both
cores of this project's 2-core machines usable, it does not: a busy loop on the other core costs the probe nothing
(the busy loop's row). Run with fewer usable cores than the machine has (a CPU affinity inherited from the shell;
the result file's machine line says so), everything shares one core, and each front's idle CPU is the probe's loss.

A probe process times the CPU engine's hot operations in a loop, single-threaded as the engines run them
(`OMP_NUM_THREADS=1`): one chunk's attention deep in a document (`CHUNK_TOKENS` queries over `DEPTH_TOKENS` keys,
masked as `harness.cpu_attention` masks it) and one matmul. Its median pass is taken beside: nothing; a busy loop
(a fully busy neighbour, the reference); and each front as `loadtests.peers` runs it as shipped, with its two CPU
engines started, warmed up and idle. The rounds beside nothing are taken first and again after each front, and all
of them make the baseline. Printed per row: the probe's median pass, its ratio to the baseline, and the CPU the
rest of the machine used meanwhile (its busy time less the probe's own), in cores.
Writes docs/results/compute-beside-fronts/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.front_profile import cpu_s
from harness.cpu_env import cpu_sglang_env
from harness.results import records
from loadtests import peers

CHUNK_TOKENS = 400
DEPTH_TOKENS = 8_000
"""A chunk 8k tokens into a 12k-token document: the passes `benchmarks.chat_path`'s documents spend most time in."""
HEADS, HEAD_DIM = 4, 64
SETTLE_S = 5.0
"""After a front answers: its replicas' and engines' start-up work ends."""
NOTHING, BUSY = "nothing", "a busy loop on a core (the reference)"
FRONTS = ("fairshare", "cache_aware")
"""The default fronts (any of `loadtests.peers.FRONTS` may be named): this app and the peers' reference."""


@dataclass(frozen=True)
class Round:
    """One probe run: its passes' seconds, and the cores the rest of the machine used while they ran."""

    passes_s: list[float]
    other_cores: float


def probe(seconds: float) -> Round:
    """Runs in the probe process: passes for `seconds`, timed one by one."""
    import psutil
    import torch

    torch.set_num_threads(1)
    q = torch.randn(1, HEADS, CHUNK_TOKENS, HEAD_DIM, dtype=torch.bfloat16)
    k = torch.randn(1, HEADS, DEPTH_TOKENS + CHUNK_TOKENS, HEAD_DIM, dtype=torch.bfloat16)
    mask = torch.ones(CHUNK_TOKENS, DEPTH_TOKENS + CHUNK_TOKENS, dtype=torch.bool).tril(DEPTH_TOKENS)
    a, w = torch.randn(CHUNK_TOKENS, 512), torch.randn(512, 2048)

    def one_pass() -> None:
        torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=mask)
        torch.mm(a, w)

    one_pass()  # first-touch allocations outside the window
    me, passes = psutil.Process(), []
    busy0, own0 = _busy_s(psutil.cpu_times()), cpu_s(me)
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        t = time.perf_counter()
        one_pass()
        passes.append(time.perf_counter() - t)
    elapsed = time.monotonic() - start
    other = _busy_s(psutil.cpu_times()) - busy0 - (cpu_s(me) - own0)
    return Round(passes, max(other, 0.0) / elapsed)


PROBE_MAIN = "import sys; from benchmarks.compute_beside_fronts import probe_main; probe_main(float(sys.argv[1]))"


def probe_main(seconds: float) -> None:
    got = probe(seconds)
    print(json.dumps({"passes_s": got.passes_s, "other_cores": got.other_cores}))


def _busy_s(times: Any) -> float:
    """All cores' busy seconds from `psutil.cpu_times()` (every field but idle and waiting on I/O)."""
    return float(sum(times)) - times.idle - getattr(times, "iowait", 0.0)


def run_probe(seconds: float) -> Round:
    """The probe in its own process, with the engines' threading (what an engine's scheduler would run)."""
    env = {**cpu_sglang_env(), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", PROBE_MAIN, str(seconds)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=seconds + 120).stdout
    got = json.loads(out.strip().splitlines()[-1])
    return Round(got["passes_s"], got["other_cores"])


@contextlib.contextmanager
def busy_loop() -> Iterator[None]:
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def rounds_beside(neighbour: contextlib.AbstractContextManager[object], n: int, seconds: float) -> list[Round]:
    with neighbour:
        return [run_probe(seconds) for _ in range(n)]


@contextlib.contextmanager
def idle_front(start: peers.FrontStarter) -> Iterator[None]:
    with start() as (url, model):
        peers.warm_up(url, model)
        time.sleep(SETTLE_S)
        yield


def median_pass_ms(rounds: list[Round]) -> float:
    return 1000 * statistics.median(p for r in rounds for p in r.passes_s)


def table(rows: dict[str, list[Round]]) -> str:
    """Markdown: per row its median pass, the ratio to the `NOTHING` row's and the other cores (median of rounds)."""
    base = median_pass_ms(rows[NOTHING])
    lines = [
        "| beside the probe | pass, median | over nothing | rest of the machine, cores |",
        "| --- | --- | --- | --- |",
    ]
    for name, rounds in rows.items():
        ms = median_pass_ms(rounds)
        other = statistics.median(r.other_cores for r in rounds)
        lines.append(f"| {name} | {ms:.1f} ms | {ms / base:.2f}x | {other:.2f} |")
    return "\n".join(lines)


@records("compute-beside-fronts", "An engine's compute beside each idle front")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.compute_beside_fronts", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--rounds", type=int, default=4, help="Probe runs beside each neighbour.")
    ap.add_argument("--seconds", type=float, default=6.0, help="Timed passes a probe run.")
    ap.add_argument("--fronts", default=",".join(FRONTS), help=f"Comma-separated, of {peers.FRONTS}.")
    args = ap.parse_args(argv)
    fronts = [f for f in args.fronts.split(",") if f]
    if bad := [f for f in fronts if f not in peers.FRONTS]:
        ap.error(f"--fronts: unknown front {bad[0]!r}; choose from {', '.join(peers.FRONTS)}")
    print(
        f"probe: {CHUNK_TOKENS} queries over {DEPTH_TOKENS + CHUNK_TOKENS} keys (masked SDPA, bf16, {HEADS} heads) + "
        f"a {CHUNK_TOKENS}x512x2048 matmul, one thread; {args.rounds} runs of {args.seconds:g} s beside each"
    )
    rows: dict[str, list[Round]] = {NOTHING: rounds_beside(contextlib.nullcontext(), args.rounds, args.seconds)}
    rows[BUSY] = rounds_beside(busy_loop(), args.rounds, args.seconds)
    with tempfile.TemporaryDirectory(prefix="compute-beside-") as tmp:
        model = peers.build_model(Path(tmp), peers.EngineSettings().context_tokens)
        starters = peers.front_starters(model, peers.EngineSettings(), Path(tmp))
        for name in fronts:
            rows[f"{name}, idle"] = rounds_beside(idle_front(starters[name]), args.rounds, args.seconds)
            rows[NOTHING] += rounds_beside(contextlib.nullcontext(), args.rounds, args.seconds)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
