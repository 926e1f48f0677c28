"""What spacing a stream's items (`EngineKnobs.stream_spacing_s`) saves the Serve stack, on real CPU sglang engines.

    python -m benchmarks.stream_spacing [--seconds 40] [--spacings 0,0.05]

The peer benchmark's app (`loadtests.peers`: `config.sglang-cpu.yaml`, two CPU sglang engines, the schedulers at
niceness 15) started once per spacing, then a chat-only streaming load: 4 users, 40-token questions, 16 output
tokens, 0.3 s between a user's requests. Per spacing: chats a second, HTTP chunks a chat reached the client in,
the CPU a chat cost the front (ingress, Serve's proxy and controller, raylet, GCS) and the engines (sglang's
processes and the engine replicas), and the cores the engines waited for. Writes docs/results/stream-spacing/.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from harness.results import records
from loadtests import prompts
from loadtests.cpu_share import CpuSampler
from loadtests.peers import EngineSettings, _build_model, app_front, chars_per_token

USERS = 4
QUESTION_TOKENS = 40
OUTPUT_TOKENS = 16
THINK_S = 0.3
WARM_S = 5.0


@dataclass(frozen=True)
class Phase:
    spacing_s: float
    chats_per_s: float
    chunks_per_chat: float
    cores: dict[str, float]
    waited: dict[str, float]

    def ms_per_chat(self, role: str) -> float:
        return 1000 * self.cores[role] / self.chats_per_s


def chat_load(url: str, model: str, cpt: float, seconds: float) -> tuple[float, float, CpuSampler]:
    """Chats a second and chunks a chat over `seconds` of load (after `WARM_S`), with the CPU sampled meanwhile."""
    stop, lock = threading.Event(), threading.Lock()
    counts = {"chats": 0, "chunks": 0}

    def user(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            content = prompts.question(QUESTION_TOKENS, cpt, rng)
            body = {"model": model, "messages": [{"role": "user", "content": content}], "stream": True}
            with requests.post(
                f"{url}/v1/chat/completions", json={**body, "max_tokens": OUTPUT_TOKENS}, stream=True, timeout=60
            ) as r:
                r.raise_for_status()
                chunks = sum(1 for _ in r.iter_content(chunk_size=None))
            with lock:
                counts["chats"] += 1
                counts["chunks"] += chunks
            time.sleep(THINK_S)

    users = [threading.Thread(target=user, args=(i,), daemon=True) for i in range(USERS)]
    for t in users:
        t.start()
    time.sleep(WARM_S)
    sampler = CpuSampler()
    with lock:
        before = dict(counts)
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    with lock:
        chats, chunks = counts["chats"] - before["chats"], counts["chunks"] - before["chunks"]
    stop.set()
    for t in users:
        t.join()
    return chats / sampler.elapsed_s, chunks / max(1, chats), sampler


def run(model: Path, spacing_s: float, seconds: float) -> Phase:
    start = app_front(model, EngineSettings(), upstream=False, engine_knobs={"stream_spacing_s": spacing_s})
    with start() as (url, model_id):
        rate, chunks, sampler = chat_load(url, model_id, chars_per_token(model), seconds)
    return Phase(spacing_s, rate, chunks, sampler.cores(), sampler.waiting_cores())


@records("stream-spacing", "What spacing a stream's items saves the Serve stack (real CPU sglang engines)")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.stream_spacing", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=40.0, help="Sampled load per spacing (after 5 s of warm-up).")
    ap.add_argument("--spacings", default="0,0.05", help="stream_spacing_s values, comma-separated, in run order.")
    args = ap.parse_args(argv)
    spacings = [float(s) for s in args.spacings.split(",")]
    print(
        f"{USERS} chat users, {QUESTION_TOKENS}-token questions, {OUTPUT_TOKENS} output tokens, {THINK_S} s between "
        f"requests; {args.seconds:.0f} s sampled per spacing; {EngineSettings()}"
    )
    with tempfile.TemporaryDirectory(prefix="stream-spacing-") as tmp:
        model = _build_model(Path(tmp), EngineSettings().context_tokens)
        phases = [run(model, s, args.seconds) for s in spacings]
    print("spacing s | chats/s | chunks a chat | front CPU ms a chat | engines CPU ms a chat | engines waited (cores)")
    print("---|---|---|---|---|---")
    for p in phases:
        print(
            f"{p.spacing_s:g} | {p.chats_per_s:.2f} | {p.chunks_per_chat:.1f} | {p.ms_per_chat('front'):.1f} | "
            f"{p.ms_per_chat('engines'):.1f} | {p.waited['engines']:.2f}"
        )
    base = phases[0]
    for p in phases[1:]:
        front = p.ms_per_chat("front") / base.ms_per_chat("front")
        print(
            f"spacing {p.spacing_s:g} against {base.spacing_s:g}: front CPU a chat {front:.2f}x, "
            f"chats/s {p.chats_per_s / base.chats_per_s:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
