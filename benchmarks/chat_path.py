"""Where an idle request's first token goes: the engine itself, sglang's HTTP server, this app with one engine or two.

    python -m benchmarks.chat_path [--probes 30] [--followups 8] [--rounds 2]

The same new chats (`loadtests.peers.idle_chat_ttfts`: one at a time, 4 tokens each, every one new), the same
documents (a new one of `DOC_TOKENS` tokens asked for a short answer: its whole prefill) and the same follow-ups (a
question on that document that re-sends the conversation, as a plain client does), the client's time to the first
content, on one CPU sglang engine of the peer benchmark's settings (`loadtests.peers`) running the plugin with the
app's policy (`peers.app_policy`), reached four ways:

- `engine`: the engine in a process of its own, called as the app's replica calls it (`EngineThread`,
  `SglangOpenAI`: sglang's own serving classes, no HTTP, no Ray): what the engine takes;
- `sglang server`: `python -m sglang.launch_server`, over HTTP: what sglang's own front adds to it;
- `app`: `config.sglang-cpu.yaml` on a local Ray, as shipped but with one engine replica (HAProxy, the ingress,
  the Ray hop to the replica and back, Ray's own processes), over HTTP: what this app's front adds;
- `app, 2 engines`: the same with the shipped two engine replicas, the second idle beside the first: what a second
  engine on the two cores costs the first. The ways above run one engine each; until 12-06 `app` ran two, and this
  benchmark put the second engine's cost on the front's account.

`--gap-s` waits that long before each request: with it past the app's busy load-read interval
(`serve_app.engines.sglang.sglang_backend.LOAD_REFRESH_S`), each request meets an engine replica gone idle, as a
replica serving a few requests a minute does; 0 (the default) sends them back to back.

The four take turns in rounds, the order reversed every other round. The table gives each way's p10/p50/p90 over
every round's chats, documents and follow-ups, and what each adds over `engine` at the median: for a document, what
a front costs a lone prefill (the peer benchmark's document tokens/s with nothing beside it). Writes
docs/results/chat-path/.
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
from typing import Any, NamedTuple

import requests

from harness.cpu_env import cpu_sglang_env
from harness.results import records
from harness.sglang_engine import log_tail
from harness.sglang_server import LocalServer
from loadtests import peers, prompts
from loadtests.sse import SseEvent, SseParser, content_of, outcome
from scheduler.sglang_plugin.env import policy_env

WAYS = ("engine", "sglang server", "app", "app, 2 engines")
KINDS = ("chat", "document", "follow-up")
SEED = 23
DOC_TOKENS = 12_000
"""A follow-up's document: the peer benchmark's documents are 10-14k tokens."""
ANSWER_TOKENS = 8
"""A document's answer, which the follow-up re-sends."""
Ttfts = dict[str, list[float]]
"""Seconds to the first content by kind (`KINDS`)."""


class Probes(NamedTuple):
    chats: int
    followups: int
    """Documents, each with its follow-up."""
    gap_s: float = 0.0
    """Seconds waited before each request."""


def engine_env(engine: peers.EngineSettings) -> dict[str, str]:
    """A CPU sglang process's environment with the app's policy for the plugin."""
    return {**cpu_sglang_env(), **policy_env(peers.app_policy(engine, upstream=False))}


def engine_ttfts(model: Path, cpt: float, probes: Probes, out: Path) -> Ttfts:
    """`engine`: in a child process (sglang must be imported with the CPU environment set)."""
    cmd = [sys.executable, "-m", "benchmarks.chat_path", "--engine-only", str(model), "--cpt", str(cpt)]
    cmd += ["--probes", str(probes.chats), "--followups", str(probes.followups), "--gap-s", str(probes.gap_s)]
    with open(out / "engine.log", "w") as log:
        done = subprocess.run(cmd, env=engine_env(peers.EngineSettings()), stdout=subprocess.PIPE, stderr=log)
    if done.returncode != 0:
        raise RuntimeError(f"the in-process engine failed (rc {done.returncode}):\n{log_tail(out / 'engine.log')}")
    got = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return {kind: [float(x) for x in got[kind]] for kind in KINDS}


def server_ttfts(model: Path, cpt: float, probes: Probes, out: Path) -> Ttfts:
    engine = peers.EngineSettings()
    with LocalServer(model, engine.server_args(), engine_env(engine), out / "server.log") as server:
        return http_ttfts(f"http://127.0.0.1:{server.port}", cpt, probes)


def app_ttfts(model: Path, cpt: float, probes: Probes, out: Path, num_engines: int = 1) -> Ttfts:
    with peers.app_front(model, peers.EngineSettings(), upstream=False, num_engines=num_engines)() as (url, _):
        return http_ttfts(url, cpt, probes)


def app_two_engines_ttfts(model: Path, cpt: float, probes: Probes, out: Path) -> Ttfts:
    return app_ttfts(model, cpt, probes, out, num_engines=2)


def http_ttfts(url: str, cpt: float, probes: Probes) -> Ttfts:
    name = peers.model_id(url)
    peers.warm_up(url, name)
    chats = peers.idle_chat_ttfts(url, name, cpt, SEED, probes.chats, probes.gap_s)
    rng = random.Random(SEED)
    documents, followups = [], []
    for i in range(probes.followups):
        asked = document_question(i, cpt, rng)
        time.sleep(probes.gap_s)
        ttft, answer = http_answer(url, name, asked)
        documents.append(ttft)
        time.sleep(probes.gap_s)
        followups.append(peers.first_content_s(url, name, follow_up(asked, answer, cpt, rng), 4))
    return {"chat": chats, "document": documents, "follow-up": followups}


def http_answer(url: str, name: str, messages: list[dict[str, str]]) -> tuple[float, str]:
    """A document's answer, streamed: seconds to its first content, and its text."""
    body: dict[str, Any] = {"model": name, "messages": messages, "max_tokens": ANSWER_TOKENS, "stream": True}
    parser, sent = SseParser(), time.perf_counter()
    with requests.post(f"{url}/v1/chat/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for chunk in r.iter_content(chunk_size=None):
            parser.feed(chunk, time.perf_counter())
    parser.close(time.perf_counter())
    return answer_of(parser.events, sent)


def answer_of(events: list[SseEvent], sent: float) -> tuple[float, str]:
    """A whole stream's time to first content (from `sent`) and text."""
    got = outcome(events, sent)
    if got.error is not None or got.ttft_s is None:
        raise RuntimeError(f"a document's answer: {got.error or 'no content'}")
    return got.ttft_s, "".join(content_of(p) for p in (e.json() for e in events) if p is not None)


def document_question(i: int, cpt: float, rng: random.Random) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompts.document(f"chat-path-{i}", DOC_TOKENS, cpt, rng) + "\nSummarise it."}]


def follow_up(asked: list[dict[str, str]], answer: str, cpt: float, rng: random.Random) -> list[dict[str, str]]:
    question = prompts.question(peers.IDLE_PROBE_TOKENS, cpt, rng)
    return [*asked, {"role": "assistant", "content": answer}, {"role": "user", "content": question}]


async def _in_process(model: Path, cpt: float, probes: Probes) -> Ttfts:
    from serve_app.engines.sglang.engine_thread import EngineThread
    from serve_app.engines.sglang.openai_serving import SglangOpenAI
    from serve_app.replica.backend import ResponseBody

    def build() -> Any:
        from sglang.srt.entrypoints.engine import Engine

        return Engine(model_path=str(model), **peers.EngineSettings().engine_kwargs())

    thread = EngineThread()
    engine = await thread.build(build)
    serving = await thread.build(lambda: SglangOpenAI(engine))

    async def first_content_s(rid: str, messages: list[dict[str, str]]) -> float:
        body = {"model": "m", "messages": messages, "max_tokens": 4, "stream": True}
        await asyncio.sleep(probes.gap_s)
        sent = time.perf_counter()
        async for batch in thread.batches(lambda: serving.respond("chat", body, rid)):
            if any(isinstance(p, ResponseBody) and b'"content"' in p.data for p in batch):
                return time.perf_counter() - sent
        raise RuntimeError("a stream without content")

    async def answer(rid: str, messages: list[dict[str, str]]) -> tuple[float, str]:
        body = {"model": "m", "messages": messages, "max_tokens": ANSWER_TOKENS, "stream": True}
        await asyncio.sleep(probes.gap_s)
        parser, sent = SseParser(), time.perf_counter()
        async for batch in thread.batches(lambda: serving.respond("chat", body, rid)):
            now = time.perf_counter()
            for part in batch:
                if isinstance(part, ResponseBody):
                    parser.feed(part.data, now)
        parser.close(time.perf_counter())
        return answer_of(parser.events, sent)

    def question(rng: random.Random) -> list[dict[str, str]]:
        return [{"role": "user", "content": prompts.question(peers.IDLE_PROBE_TOKENS, cpt, rng)}]

    try:
        await first_content_s("warm-up", [{"role": "user", "content": "hello"}])  # the lazy paths before the clock
        rng = random.Random(SEED)
        chats = [await first_content_s(f"chat-{i}", question(rng)) for i in range(probes.chats)]
        rng, documents, followups = random.Random(SEED), [], []
        for i in range(probes.followups):
            asked = document_question(i, cpt, rng)
            ttft, text = await answer(f"doc-{i}", asked)
            documents.append(ttft)
            followups.append(await first_content_s(f"follow-up-{i}", follow_up(asked, text, cpt, rng)))
        return {"chat": chats, "document": documents, "follow-up": followups}
    finally:
        engine.shutdown()
        thread.stop()


MEASURE: dict[str, Callable[[Path, float, Probes, Path], Ttfts]] = {
    "engine": engine_ttfts,
    "sglang server": server_ttfts,
    "app": app_ttfts,
    "app, 2 engines": app_two_engines_ttfts,
}


def measure(tmp: Path, rounds: int, probes: Probes) -> dict[str, Ttfts]:
    """Each way's TTFTs over `rounds`, the ways taking turns; the model and the logs in `tmp`."""
    model = peers.build_model(tmp, peers.EngineSettings().context_tokens)
    cpt = peers.chars_per_token(model)
    ttfts: dict[str, Ttfts] = {way: {kind: [] for kind in KINDS} for way in WAYS}
    for r in range(rounds):
        for way in WAYS if r % 2 == 0 else WAYS[::-1]:
            for kind, got in MEASURE[way](model, cpt, probes, tmp).items():
                ttfts[way][kind] += got
            so_far = ", ".join(f"{k} {statistics.median(v) * 1000:.1f} ms" for k, v in ttfts[way].items() if v)
            print(f"round {r + 1}, {way}: p50 {so_far} so far")
    return ttfts


def percentiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=10)
    return q[0], statistics.median(values), q[-1]


@records("chat-path", "Where an idle request's first token goes: the engine, sglang's HTTP server, this app")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.chat_path", description=__doc__.split("\n\n")[0])
    ap.add_argument("--probes", type=int, default=30, help="Chats a way, a round.")
    ap.add_argument(
        "--followups", type=int, default=8, help="Documents, each with its follow-up, a way, a round (both timed)."
    )
    ap.add_argument("--rounds", type=int, default=2, help="Rounds: each way once a round, the order reversed.")
    ap.add_argument("--gap-s", type=float, default=0.0, help="Seconds waited before each request (0: back to back).")
    args = ap.parse_args(argv)
    if args.probes < 2 or args.followups < 2:
        ap.error("--probes and --followups: at least 2 (the table's percentiles)")
    if args.gap_s < 0:
        ap.error(f"--gap-s {args.gap_s}: must be >= 0")
    spacing = f"{args.gap_s:g} s apart" if args.gap_s else "back to back"
    print(
        f"{args.rounds} rounds of {args.probes} new chats (4 tokens) and {args.followups} new {DOC_TOKENS}-token "
        f"documents, each with a follow-up (a question on it, re-sending it), a way, one at a time, {spacing}; "
        "TTFT at the client"
    )
    with tempfile.TemporaryDirectory(prefix="chat-path-") as folder:
        ttfts = measure(Path(folder), args.rounds, Probes(args.probes, args.followups, args.gap_s))
    print("\n| what | way | requests | TTFT p10 (ms) | p50 (ms) | p90 (ms) | p50 over `engine` (ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for kind in KINDS:
        base = statistics.median(ttfts["engine"][kind])
        for way in WAYS:
            got = ttfts[way][kind]
            p10, p50, p90 = percentiles(got)
            print(
                f"| {kind} | {way} | {len(got)} | {p10 * 1000:.1f} | {p50 * 1000:.1f} | {p90 * 1000:.1f} | "
                f"{(p50 - base) * 1000:+.1f} |"
            )
    return 0


def engine_only(argv: list[str]) -> int:
    """The child of `engine_ttfts`: prints the TTFTs as a JSON list on its last line."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine-only", type=Path, required=True)
    ap.add_argument("--cpt", type=float, required=True)
    ap.add_argument("--probes", type=int, required=True)
    ap.add_argument("--followups", type=int, required=True)
    ap.add_argument("--gap-s", type=float, required=True)
    args = ap.parse_args(argv)
    probes = Probes(args.probes, args.followups, args.gap_s)
    print(json.dumps(asyncio.run(_in_process(args.engine_only, args.cpt, probes))))
    return 0


if __name__ == "__main__":
    if "--engine-only" in sys.argv:
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        sys.exit(engine_only(sys.argv[1:]))
    sys.exit(main())
