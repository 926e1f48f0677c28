"""Where the plugin's time goes in sglang's scheduler loop: py-spy samples of the scheduler process, plugin on.

    python -m benchmarks.sglang_plugin_profile                  # both cases, 6 s each at 1 kHz
    python -m benchmarks.sglang_plugin_profile --case rejected --seconds 4

One real sglang server with the plugin, as `benchmarks.sglang_plugin_cost` starts it (its tiny model, KV pool and
server arguments), a stream decoding, and per case: nothing else (``lone``), or one document waiting, rejected for KV
capacity (``rejected``, the case of issue 36). py-spy samples the scheduler process at ``--rate`` Hz for
``--seconds``. A sample is the plugin's when the deepest frame that is this project's or sglang's is this project's:
the plugin's own work and what it calls (numpy, the fit), not sglang's work below a hook that wraps it (the hook
around ``run_batch`` holds the whole forward pass). The share ranks the plugin's frames, but it is no bound on
what the plugin costs: py-spy reads the stack of a running process without stopping it and under-samples short
frames, and a plugin call of tens of microseconds by its own clock and by the thread's CPU clock took a tenth of
that in py-spy's samples. The plugin's clock (`sglang_plugin_cost`, clocked) is the figure for its cost per
iteration; the printed "at most" is what the share alone would allow.

Printed per case: the samples, the plugin's share, the on/off ratio that share allows, and the plugin's frames by
samples. Writes docs/results/sglang-plugin-profile/ (`harness.results`).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.sglang_plugin_cost import (
    CASES as COST_CASES,
)
from benchmarks.sglang_plugin_cost import (
    STREAM_PROMPT,
    Batch,
    Stream,
    ids,
    load,
    scheduler_pid,
    server_args,
    server_env,
    wait_until,
)
from harness.results import records
from harness.sglang_server import LocalServer
from harness.tiny_model import TinyModelSpec, build_tiny_model

CASES = {case: COST_CASES[case] for case in ("lone", "rejected")}
"""`sglang_plugin_cost`'s cases of one stream alone and beside one KV-rejected request."""
OWN_PREFIX = "(scheduler/"
"""py-spy names a frame ``function (path:line)``, the path relative to its import root: this project's plugin and
policy core are ``scheduler/...``."""
LIBRARIES = re.compile(r"\((?:torch|numpy|scipy|multiprocessing|threading|asyncio|json|collections|logging)/|<frozen")
"""Frames that are neither the project's nor sglang's: whoever called them owns the sample."""
FRAME_PATH = re.compile(r"\(([^:()]+):\d+\)$")


@dataclass(frozen=True)
class Profile:
    samples: int
    own: collections.Counter[str]
    """The plugin's samples by its deepest frame."""

    @property
    def share(self) -> float:
        return sum(self.own.values()) / self.samples if self.samples else 0.0

    @property
    def ratio_bound(self) -> float:
        """On against off, were the plugin's share all it added (an understatement: see the module docstring)."""
        return 1.0 / (1.0 - self.share)


def owner(frame: str) -> str | None:
    """Whose `frame` is: "own" (this project's), "sglang" (sglang's, or other code that is no library), or None (a
    library's: whoever called it owns the sample)."""
    if OWN_PREFIX in frame:
        return "own"
    if not FRAME_PATH.search(frame) or LIBRARIES.search(frame):
        return None
    return "sglang"


def raw_samples(lines: Iterable[str]) -> Iterator[tuple[str, int]]:
    """py-spy's raw output (``frame;frame;... count`` a line, outermost frame first) as (stack, samples)."""
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if stack:
            yield stack, int(count)


def profile(lines: Iterable[str]) -> Profile:
    """py-spy's raw output (``frame;frame;... count`` per line, outermost first) attributed as the module says."""
    samples, own = 0, collections.Counter[str]()
    for stack, n in raw_samples(lines):
        samples += n
        frames = stack.split(";")
        deepest = next(((f, who) for f in reversed(frames) if (who := owner(f)) is not None), None)
        if deepest is not None and deepest[1] == "own":
            own[deepest[0]] += n
    return Profile(samples, own)


def py_spy() -> str:
    """py-spy (Ray's dependency): beside this Python, else on the PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy not found: it comes with ray[serve] (pip install -e .)")
    return found


def sample(case: str, seconds: int, rate: int, model: Path, workdir: Path) -> Profile:
    with LocalServer(model, server_args("cpu"), server_env("cpu"), workdir / f"{case}.log") as server:
        port = server.port
        stream = Stream(port, f"{case}-stream", ids(STREAM_PROMPT, seed=1))
        wait_until("the stream's first tokens", lambda: stream.tokens() >= 2 or stream.error)
        if CASES[case]:
            Batch(port, case, CASES[case], seed=0)
            wait_until("the waiting document", lambda: load(port)["num_waiting_reqs"] >= CASES[case])
        out = workdir / f"{case}.txt"
        cmd = [py_spy(), "record", "-p", str(scheduler_pid(server)), "-d", str(seconds), "-r", str(rate)]
        subprocess.run([*cmd, "-f", "raw", "-o", str(out), "--nonblocking"], check=True, capture_output=True)
        if not stream.is_alive() or stream.error:
            raise RuntimeError(f"{case}: the stream ended while sampled ({stream.error}): sample fewer seconds")
        return profile(out.read_text().splitlines())


def print_profile(case: str, p: Profile, top: int) -> None:
    print(
        f"{case}: {p.samples} samples, the plugin's {sum(p.own.values())} ({p.share:.2%}): on/off "
        f"{p.ratio_bound:.4f} were that its whole cost (py-spy under-samples short frames: read the plugin's clock)"
    )
    for frame, n in p.own.most_common(top):
        print(f"  {n:6d}  {frame}")


@records("sglang-plugin-profile", "Where the plugin's time goes in sglang's scheduler loop (py-spy, CPU sglang)")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.sglang_plugin_profile", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--case", choices=[*CASES, "all"], default="all")
    ap.add_argument("--seconds", type=int, default=6, help="Sampling time a case (the stream decodes ~8 s).")
    ap.add_argument("--rate", type=int, default=1000, help="Samples a second.")
    ap.add_argument("--top", type=int, default=12, help="The plugin's frames to print a case.")
    args = ap.parse_args(argv)
    cases = list(CASES) if args.case == "all" else [args.case]
    print(f"py-spy on the scheduler process, {args.rate} Hz for {args.seconds} s a case; plugin on")
    with tempfile.TemporaryDirectory(prefix="plugin-profile-") as tmp:
        model = build_tiny_model(Path(tmp) / "model", TinyModelSpec())
        for case in cases:
            print_profile(case, sample(case, args.seconds, args.rate, model, Path(tmp)), args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
