"""What spacing a stream's items (`EngineKnobs.stream_spacing_s`) saves the Serve stack, on real CPU sglang engines.

    python -m benchmarks.stream_spacing [--seconds 40] [--spacings 0,0.05]

The peer benchmark's app (`loadtests.peers`: `config.sglang-cpu.yaml`, two CPU sglang engines, every process at
the priority it starts with) under a chat-only streaming load: 4 users, 40-token questions, 16 output tokens, 0.3 s
between a user's requests. The spacings take turns in rounds on the one running app (a live `user_config` change), so a
pair of phases shares the machine's state. Per phase: chats a second, HTTP chunks a chat reached the client in,
the CPU a chat cost the front (ingress, Serve's proxy and controller, raylet, GCS) and the engines (sglang's
processes and the engine replicas), and the cores the engines waited for; then, per round, each spacing's front
CPU a chat over the first spacing's, and their median. Writes docs/results/stream-spacing/.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from harness import local_serve as sc
from harness.results import records
from loadtests import prompts
from loadtests.app import LocalApp
from loadtests.cpu_share import CpuSampler
from loadtests.peers import EngineSettings, app_front, build_model, chars_per_token

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


def set_spacing(app: LocalApp, spacing_s: float) -> None:
    """A live change: Serve passes the new `user_config` to the running replicas (the engines keep running)."""
    sc.deployment(app.config, "Engine")["user_config"]["stream_spacing_s"] = spacing_s
    sc.deploy(app.config)


def phase(app: LocalApp, model_id: str, cpt: float, spacing_s: float, seconds: float) -> Phase:
    set_spacing(app, spacing_s)
    rate, chunks, sampler = chat_load(app.url, model_id, cpt, seconds)
    return Phase(spacing_s, rate, chunks, sampler.cores(), sampler.waiting_cores())


@records("stream-spacing", "What spacing a stream's items saves the Serve stack (real CPU sglang engines)")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.stream_spacing", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="Sampled load a phase (after 5 s of warm-up).")
    ap.add_argument("--rounds", type=int, default=3, help="Rounds: each spacing once a round, in the given order.")
    ap.add_argument("--spacings", default="0,0.05", help="stream_spacing_s values, comma-separated, in run order.")
    args = ap.parse_args(argv)
    spacings = [float(s) for s in args.spacings.split(",")]
    print(
        f"{USERS} chat users, {QUESTION_TOKENS}-token questions, {OUTPUT_TOKENS} output tokens, {THINK_S} s between "
        f"requests; {args.rounds} rounds of {args.seconds:.0f} s a spacing; {EngineSettings()}"
    )
    phases: list[list[Phase]] = []
    with tempfile.TemporaryDirectory(prefix="stream-spacing-") as tmp:
        model = build_model(Path(tmp), EngineSettings().context_tokens)
        cpt, started = chars_per_token(model), list[LocalApp]()
        with app_front(model, EngineSettings(), upstream=False, started=started)() as (_, model_id):
            for _ in range(args.rounds):
                phases.append([phase(started[0], model_id, cpt, s, args.seconds) for s in spacings])
    print("round | spacing s | chats/s | chunks a chat | front CPU ms a chat | engines CPU ms a chat | engines waited")
    print("---|---|---|---|---|---|---")
    for i, row in enumerate(phases, 1):
        for p in row:
            print(
                f"{i} | {p.spacing_s:g} | {p.chats_per_s:.2f} | {p.chunks_per_chat:.1f} | {p.ms_per_chat('front'):.1f} "
                f"| {p.ms_per_chat('engines'):.1f} | {p.waited['engines']:.2f}"
            )
    for j, s in enumerate(spacings[1:], 1):
        ratios = [row[j].ms_per_chat("front") / row[0].ms_per_chat("front") for row in phases]
        rates = [row[j].chats_per_s / row[0].chats_per_s for row in phases]
        print(
            f"spacing {s:g} against {spacings[0]:g}, per round: front CPU a chat "
            f"{', '.join(f'{r:.2f}x' for r in ratios)} (median {statistics.median(ratios):.2f}x); chats/s "
            f"{', '.join(f'{r:.2f}x' for r in rates)} (median {statistics.median(rates):.2f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
