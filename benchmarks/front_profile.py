"""Where this app's processes spend their CPU on a chat, by layer: py-spy samples of the ingress and the engines.

    python -m benchmarks.front_profile [--seconds 20] [--rate 200]

The app as `loadtests.peers` runs it (`config.sglang-cpu.yaml`, two CPU sglang engines, every process at the
priority it starts with), new chats sent one at a time (`peers.idle_chat_ttfts`' 40-token questions, 4 output
tokens) while py-spy samples every thread of the ingress and of each engine replica for ``--seconds``. py-spy
records a thread only while it runs, so each sample is CPU time. A sample goes to the first layer in `LAYERS` whose
frames its stack holds: the deepest layers come first, so a sample inside the tokenizer under the ingress's handler
is the tokenizer's, and one in Serve's router under the handler is Serve's. In an engine replica, what its engine's
own loop runs (`EngineThread`: sglang's serving classes and tokenizer manager) is sglang's.

Printed: per role (the ingress, the engine replicas together), its CPU milliseconds a chat by the processes' own
clocks, and each layer's milliseconds by the samples and share of the samples in a layer. Samples that hold only a
thread's entry frame (`ENTRY`) are counted apart: a thread in native code (a Ray core worker's loop, uvloop) shows
py-spy nothing else, and py-spy takes many waiting ones for running. py-spy's own reading costs the processes CPU
and it under-samples short frames: the shares rank the layers; the processes' clocks are the CPU figure (and
`benchmarks.serve_overhead` the CPU per request under load). Writes docs/results/front-profile/.
"""

from __future__ import annotations

import argparse
import collections
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from benchmarks.sglang_plugin_profile import py_spy, raw_samples
from harness.results import records
from loadtests import peers, prompts

SEED = 23
ENGINE_LOOP = "EngineThread._run"
"""The frame under everything an engine replica's sglang loop runs (`serve_app.engines.sglang.engine_thread`)."""
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tokenizer (this app)", ("serve_app/tokenizer.py",)),
    ("routing policy (this app)", ("serve_app/routing/",)),
    ("sglang's serving classes and tokenizer manager", (ENGINE_LOOP,)),
    ("Ray's and Serve's metrics", ("ray/util/metrics.py", "ray/serve/metrics.py", "MetricsManager")),
    ("Serve's request router", ("ray/serve/_private/router.py", "request_router/")),
    ("gRPC and serialization", ("grpc/", "serialization.py", "cloudpickle", "replica_result.py")),
    ("API: middlewares, handlers, relay (this app)", ("serve_app/api/",)),
    ("replica and backend (this app)", ("serve_app/",)),
    ("Serve's replica", ("ray/serve/",)),
    ("FastAPI, Starlette, uvicorn", ("fastapi/", "starlette/", "uvicorn/")),
)
OTHER = "other Python (asyncio, the interpreter, libraries called from no layer)"
ENTRY = "a thread's entry frame only"
"""A sample whose innermost frame is where a thread entered native code and stays: a Ray core worker's loop, an event
loop's `run_forever` (uvloop), a wait. py-spy takes many of these for running (their count far exceeds what the
processes' clocks allow), so they are counted apart and left out of the layers' shares."""
ENTRY_FRAMES = (
    "Thread.run (threading.py:",
    "Worker.main_loop (",
    "_worker (concurrent/futures/thread.py:",
    "Condition.wait (",
    "Poller.poll (",
    f"{ENGINE_LOOP} (",
)
ROLES = {"ingress": "ServeReplica:fairshare:Ingress", "engine replicas": peers.ENGINE_REPLICA}


def layer_of(stack: str) -> str:
    if stack.rpartition(";")[2].startswith(ENTRY_FRAMES):
        return ENTRY
    return next((name for name, marks in LAYERS if any(m in stack for m in marks)), OTHER)


def layers(lines: Iterable[str]) -> collections.Counter[str]:
    """py-spy's raw output (``frame;frame;... count`` a line) counted by layer."""
    counts = collections.Counter[str]()
    for stack, n in raw_samples(lines):
        counts[layer_of(stack)] += n
    return counts


def chats(url: str, model: str, cpt: float, seconds: float) -> int:
    """New chats one at a time for `seconds`; how many were sent."""
    rng, sent, end = random.Random(SEED), 0, time.monotonic() + seconds
    while time.monotonic() < end:
        peers.first_content_s(url, model, prompts.question(peers.IDLE_PROBE_TOKENS, cpt, rng), 4)
        sent += 1
    return sent


@dataclass
class Role:
    """One role's processes while sampled: py-spy's samples by layer, and the CPU seconds their own clocks counted."""

    samples: collections.Counter[str] = field(default_factory=collections.Counter)
    cpu_s: float = 0.0


def cpu_s(p: psutil.Process) -> float:
    times = p.cpu_times()
    return float(times.user + times.system)


def measure(seconds: int, rate: int, tmp: Path) -> tuple[dict[str, Role], int]:
    """Each role's samples and CPU, and the chats sent while they were taken."""
    model = peers.build_model(tmp, peers.EngineSettings().context_tokens)
    cpt = peers.chars_per_token(model)
    with peers.app_front(model, peers.EngineSettings(), upstream=False)() as (url, name):
        peers.warm_up(url, name)
        peers.idle_chat_ttfts(url, name, cpt, SEED, 10)  # the lazy paths before the samples
        spies = []
        for role, title in ROLES.items():
            for p in peers.processes_titled(title):
                out = tmp / f"{role}-{p.pid}.txt"
                cmd = [py_spy(), "record", "-p", str(p.pid), "-d", str(seconds), "-r", str(rate), "--threads"]
                spy = subprocess.Popen([*cmd, "-f", "raw", "-o", str(out), "--nonblocking"])
                spies.append((role, p, cpu_s(p), out, spy))
        sent = chats(url, name, cpt, seconds)
        roles = {role: Role() for role in ROLES}
        for role, p, started_s, out, spy in spies:
            roles[role].cpu_s += cpu_s(p) - started_s
            if spy.wait(timeout=seconds + 60) != 0:
                raise RuntimeError(f"py-spy failed on {out.name}")
            roles[role].samples += layers(out.read_text().splitlines())
    return roles, sent


@records("front-profile", "Where this app's processes spend their CPU on a chat, by layer (py-spy)")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.front_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=20, help="Sampling time (chats are sent all along).")
    ap.add_argument("--rate", type=int, default=200, help="Samples a second.")
    args = ap.parse_args(argv)
    print(
        f"py-spy at {args.rate} Hz for {args.seconds} s on the ingress and the engine replicas; new chats one at a time"
    )
    with tempfile.TemporaryDirectory(prefix="front-profile-") as tmp:
        roles, sent = measure(args.seconds, args.rate, Path(tmp))
    print(f"{sent} chats\n\n| process | layer | CPU ms a chat | share of the layers |\n| --- | --- | --- | --- |")
    for name, role in roles.items():
        entry = role.samples.pop(ENTRY, 0)
        total = sum(role.samples.values())
        print(f"| {name} | all, by the processes' clocks | {1000 * role.cpu_s / sent:.1f} | |")
        print(f"| {name} | {ENTRY} (left out) | {1000 * entry / args.rate / sent:.1f} by the samples | |")
        for layer, n in role.samples.most_common():
            print(f"| {name} | {layer} | {1000 * n / args.rate / sent:.1f} by the samples | {n / total:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
