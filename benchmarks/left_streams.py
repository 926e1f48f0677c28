"""What a stream costs Serve's HAProxy front when the client reads it whole and when the client leaves it at its first
token, with the HAProxy Ray bundles (splice on, as Ray's template sets it) and with the images' wrapper (splice off:
`serve_app.config.haproxy_binary`).

    python -m benchmarks.left_streams [--requests 20] [--max-tokens 64]

The app as `loadtests.peers` runs it (`config.sglang-cpu.yaml`, two CPU sglang engines, the tiny model), started once
per setting; the wrapper is named by `RAY_SERVE_HAPROXY_BINARY_PATH` in the environment Ray starts with (the
controller's HAProxy manager inherits it, as it inherits `controller_options` on a cluster). Requests go one at a
time, each a new chat of `--max-tokens` tokens; a left one is closed at its first content. Each request is charged
the HAProxy process's CPU from its send until `SETTLE_S` after it ended, less what HAProxy takes idle over as long
(measured before the requests). Writes docs/results/left-streams/.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import requests

from harness.net import listener
from harness.results import records
from loadtests import peers, prompts
from loadtests.cpu_share import on_cpu_s
from serve_app.config import haproxy_binary

SETTLE_S = 0.5
"""How long after a request ends its HAProxy CPU is still counted (a spin after a client left lasts tens of ms)."""
IDLE_S = 5.0
SETTINGS = ("bundled (splice on)", "wrapper (splice off)")
MODES = ("read whole", "left at first token")


def cpu_s(pid: int) -> float:
    """HAProxy's CPU seconds, every thread's, to the nanosecond (psutil's clock ticks are 10 ms steps, as long as
    what a request costs)."""
    used = on_cpu_s(pid)
    assert used is not None, "this benchmark needs the kernel's schedstat (Linux)"
    return used


def one_request(url: str, model: str, question: str, max_tokens: int, leave: bool) -> None:
    """A stream read to its end, or (`leave`) closed at its first content (`peers.first_content_s`)."""
    if leave:
        peers.first_content_s(url, model, question, max_tokens)
        return
    body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens}
    with requests.post(f"{url}/v1/chat/completions", json={**body, "stream": True}, stream=True, timeout=120) as r:
        r.raise_for_status()
        for _ in r.iter_content(chunk_size=None):
            pass


@contextlib.contextmanager
def app(model: Path, wrapper: Path | None) -> Iterator[tuple[str, str]]:
    if wrapper is not None:
        os.environ[haproxy_binary.ENV] = str(wrapper)  # read when Ray starts: its HAProxy manager inherits it
    try:
        with peers.app_front(model, peers.EngineSettings(), upstream=False)() as (url, name):
            yield url, name
    finally:
        os.environ.pop(haproxy_binary.ENV, None)


def measure(url: str, name: str, cpt: float, n: int, max_tokens: int) -> tuple[dict[str, list[float]], float]:
    """HAProxy CPU ms of each request by mode, and HAProxy's idle CPU seconds a second."""
    front = listener(int(url.rsplit(":", 1)[1]))
    assert front is not None and front.name() == "haproxy", "Serve's HAProxy front holds the port"
    peers.warm_up(url, name)
    before, t0 = cpu_s(front.pid), time.monotonic()
    time.sleep(IDLE_S)
    idle_per_s = (cpu_s(front.pid) - before) / (time.monotonic() - t0)
    rng = random.Random(23)
    got: dict[str, list[float]] = {mode: [] for mode in MODES}
    for i in range(n * len(MODES)):
        mode = MODES[i % len(MODES)]
        question = prompts.question(peers.IDLE_PROBE_TOKENS, cpt, rng)
        before, t0 = cpu_s(front.pid), time.monotonic()
        one_request(url, name, question, max_tokens, leave=mode != MODES[0])
        time.sleep(SETTLE_S)
        used = cpu_s(front.pid) - before - idle_per_s * (time.monotonic() - t0)
        got[mode].append(used * 1000)
    return got, idle_per_s


@records("left-streams", "What a stream a client leaves costs Serve's HAProxy front, splice on and off")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.left_streams", description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20, help="Requests of each mode, a setting.")
    ap.add_argument("--max-tokens", type=int, default=64, help="Tokens each stream asks for.")
    args = ap.parse_args(argv)
    if args.requests < 2 or args.max_tokens < 2:
        ap.error("--requests and --max-tokens: at least 2")
    print(f"{args.requests} streams of {args.max_tokens} tokens a mode, one at a time, modes alternating")
    rows = []
    with tempfile.TemporaryDirectory(prefix="left-streams-") as folder:
        model = peers.build_model(Path(folder), peers.EngineSettings().context_tokens)
        cpt = peers.chars_per_token(model)
        wrapper = haproxy_binary.write_wrapper(Path(folder) / "bin" / "haproxy-nosplice")
        for setting in SETTINGS:
            with app(model, wrapper if setting == SETTINGS[1] else None) as (url, name):
                got, idle_per_s = measure(url, name, cpt, args.requests, args.max_tokens)
            idle = idle_per_s * 1000
            for mode, ms in got.items():
                rows.append((setting, mode, len(ms), statistics.median(ms), statistics.fmean(ms), max(ms), idle))
                print(f"{setting}, {mode}: HAProxy CPU p50 {statistics.median(ms):.2f} ms a request")
    print("\n| HAProxy | stream | requests | CPU ms a request, p50 | mean | max | HAProxy idle (CPU ms a second) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for setting, mode, n, p50, mean, most, idle in rows:
        print(f"| {setting} | {mode} | {n} | {p50:.2f} | {mean:.2f} | {most:.2f} | {idle:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
