"""Where an idle chat's first token goes: the engine itself, sglang's own HTTP server, and this app as shipped.

    python -m benchmarks.chat_path [--probes 30] [--rounds 2]

The same new chats (`loadtests.peers.idle_chat_ttfts`: one at a time, 4 tokens each, every one new), the client's
time to the first content, on one CPU sglang engine of the peer benchmark's settings (`loadtests.peers`) running
the plugin with the app's policy (`peers.app_policy`), reached three ways:

- `engine`: the engine in a process of its own, called as the app's replica calls it (`EngineThread`,
  `SglangOpenAI`: sglang's own serving classes, no HTTP, no Ray): what the engine takes;
- `sglang server`: `python -m sglang.launch_server`, over HTTP: what sglang's own front adds to it;
- `app`: `config.sglang-cpu.yaml` on a local Ray, as shipped (two engine replicas, HAProxy, the ingress, the Ray
  hop to the replica and back), over HTTP: what this app's front adds.

The three take turns in rounds, the order reversed every other round. The table gives each way's p10/p50/p90 over
every round's chats and what each adds over `engine` at the median. Writes docs/results/chat-path/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.cpu_env import cpu_sglang_env
from harness.results import records
from harness.sglang_engine import log_tail
from harness.sglang_server import LocalServer
from loadtests import peers, prompts
from scheduler.sglang_plugin.env import policy_env

WAYS = ("engine", "sglang server", "app")
SEED = 23


def engine_env(engine: peers.EngineSettings) -> dict[str, str]:
    """A CPU sglang process's environment with the app's policy for the plugin."""
    return {**cpu_sglang_env(), **policy_env(peers.app_policy(engine, upstream=False))}


def engine_ttfts(model: Path, cpt: float, probes: int, out: Path) -> list[float]:
    """`engine`: in a child process (sglang must be imported with the CPU environment set)."""
    cmd = [sys.executable, "-m", "benchmarks.chat_path", "--engine-only", str(model), "--cpt", str(cpt)]
    cmd += ["--probes", str(probes)]
    with open(out / "engine.log", "w") as log:
        done = subprocess.run(cmd, env=engine_env(peers.EngineSettings()), stdout=subprocess.PIPE, stderr=log)
    if done.returncode != 0:
        raise RuntimeError(f"the in-process engine failed (rc {done.returncode}):\n{log_tail(out / 'engine.log')}")
    return [float(x) for x in json.loads(done.stdout.decode().strip().splitlines()[-1])]


def server_ttfts(model: Path, cpt: float, probes: int, out: Path) -> list[float]:
    engine = peers.EngineSettings()
    with LocalServer(model, engine.server_args(), engine_env(engine), out / "server.log") as server:
        url = f"http://127.0.0.1:{server.port}"
        name = peers.model_id(url)
        peers.warm_up(url, name)
        return peers.idle_chat_ttfts(url, name, cpt, SEED, probes)


def app_ttfts(model: Path, cpt: float, probes: int, out: Path) -> list[float]:
    with peers.app_front(model, peers.EngineSettings(), upstream=False)() as (url, name):
        peers.warm_up(url, name)
        return peers.idle_chat_ttfts(url, name, cpt, SEED, probes)


async def _in_process(model: Path, cpt: float, probes: int) -> list[float]:
    from serve_app.engines.sglang.engine_thread import EngineThread
    from serve_app.engines.sglang.openai_serving import SglangOpenAI
    from serve_app.replica.backend import ResponseBody

    def build() -> Any:
        from sglang.srt.entrypoints.engine import Engine

        return Engine(model_path=str(model), **peers.EngineSettings().engine_kwargs())

    thread = EngineThread()
    engine = await thread.build(build)
    serving = await thread.build(lambda: SglangOpenAI(engine))

    async def first_content_s(i: int, content: str) -> float:
        body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 4, "stream": True}
        sent = time.perf_counter()
        async for batch in thread.batches(lambda: serving.respond("chat", body, f"chat-path-{i}")):
            if any(isinstance(p, ResponseBody) and b'"content"' in p.data for p in batch):
                return time.perf_counter() - sent
        raise RuntimeError("a stream without content")

    try:
        await first_content_s(-1, "hello")  # as `peers.warm_up`: the lazy paths before the clock
        rng = random.Random(SEED)
        return [await first_content_s(i, prompts.question(peers.IDLE_PROBE_TOKENS, cpt, rng)) for i in range(probes)]
    finally:
        engine.shutdown()
        thread.stop()


MEASURE: dict[str, Callable[[Path, float, int, Path], list[float]]] = {
    "engine": engine_ttfts,
    "sglang server": server_ttfts,
    "app": app_ttfts,
}


def measure(tmp: Path, rounds: int, probes: int) -> dict[str, list[float]]:
    """Each way's TTFTs over `rounds`, the ways taking turns; the model and the logs in `tmp`."""
    model = peers.build_model(tmp, peers.EngineSettings().context_tokens)
    cpt = peers.chars_per_token(model)
    ttfts: dict[str, list[float]] = {way: [] for way in WAYS}
    for r in range(rounds):
        for way in WAYS if r % 2 == 0 else WAYS[::-1]:
            ttfts[way] += MEASURE[way](model, cpt, probes, tmp)
            print(f"round {r + 1}, {way}: p50 {statistics.median(ttfts[way]) * 1000:.1f} ms so far")
    return ttfts


def percentiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=10)
    return q[0], statistics.median(values), q[-1]


@records("chat-path", "Where an idle chat's first token goes: the engine, sglang's HTTP server, this app")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.chat_path", description=__doc__.split("\n\n")[0])
    ap.add_argument("--probes", type=int, default=30, help="Chats a way, a round.")
    ap.add_argument("--rounds", type=int, default=2, help="Rounds: each way once a round, the order reversed.")
    args = ap.parse_args(argv)
    print(f"{args.rounds} rounds of {args.probes} new chats (4 tokens) a way, one at a time; TTFT at the client")
    with tempfile.TemporaryDirectory(prefix="chat-path-") as folder:
        ttfts = measure(Path(folder), args.rounds, args.probes)
    base = statistics.median(ttfts["engine"])
    print("\n| way | chats | TTFT p10 (ms) | p50 (ms) | p90 (ms) | p50 over `engine` (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for way in WAYS:
        p10, p50, p90 = percentiles(ttfts[way])
        print(
            f"| {way} | {len(ttfts[way])} | {p10 * 1000:.1f} | {p50 * 1000:.1f} | {p90 * 1000:.1f} | "
            f"{(p50 - base) * 1000:+.1f} |"
        )
    return 0


def engine_only(argv: list[str]) -> int:
    """The child of `engine_ttfts`: prints the TTFTs as a JSON list on its last line."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine-only", type=Path, required=True)
    ap.add_argument("--cpt", type=float, required=True)
    ap.add_argument("--probes", type=int, required=True)
    args = ap.parse_args(argv)
    print(json.dumps(asyncio.run(_in_process(args.engine_only, args.cpt, args.probes))))
    return 0


if __name__ == "__main__":
    if "--engine-only" in sys.argv:
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        sys.exit(engine_only(sys.argv[1:]))
    sys.exit(main())
