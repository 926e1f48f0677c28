"""Tokens to a stream's first text on the tiny model: its byte-level tokenizer over all 256 bytes, and over ASCII.

    python -m benchmarks.first_text              # 100 chats a tokenizer: about 2 minutes on 2 CPUs

A client's time to first token is the time to its first text, and sglang sends text only once it is whole
characters: a byte of 0x80 or more alone is part of one, held back until the character completes. The tiny model's
weights are random, so it emits its tokens about uniformly. For each tokenizer: one stock CPU sglang server of the
tiny model (the peer benchmark's settings), `--chats` new questions sent one at a time, streamed (sglang's
``/generate``), and for each the tokens the engine had generated when the first text came
(``meta_info.completion_tokens``). Beside a prefilling document each token after the first waits for a pass, so
these are passes a chat's first text waits for there. `loadtests.peers` serves the ASCII one
(`TinyModelSpec.ascii_only`). Writes docs/results/first-text/ (`harness.results`).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import requests

from harness.cpu_env import cpu_sglang_env
from harness.results import records
from harness.tiny_model import TinyModelSpec, build_tiny_model
from loadtests import prompts
from loadtests.peers import EngineSettings, build_model, chars_per_token, local_servers, warm_up

QUESTION_TOKENS = 40
OUTPUT_TOKENS = 16


def all_bytes_model(directory: Path, context_tokens: int) -> Path:
    """The tiny model with its byte-level tokenizer over all 256 bytes (what the tests and the laptop serve)."""
    return build_tiny_model(directory, TinyModelSpec(byte_level=True, max_position_embeddings=context_tokens))


MODELS: dict[str, Callable[[Path, int], Path]] = {
    "all 256 bytes": all_bytes_model,
    "ASCII only (the peer benchmark's)": build_model,
}
"""Tokenizer -> how its model is built (the peer benchmark's own builder for its row)."""


def tokens_to_first_text(url: str, question: str) -> int | None:
    """Tokens generated when a streamed request's first text came; None when none came."""
    body = {"text": question, "sampling_params": {"max_new_tokens": OUTPUT_TOKENS}, "stream": True}
    with requests.post(f"{url}/generate", json=body, stream=True, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                chunk = json.loads(line[len(b"data: ") :])
                if chunk["text"]:
                    return int(chunk["meta_info"]["completion_tokens"])
    return None


def measure(model: Path, chats: int, out: Path) -> Counter[int | None]:
    cpt = chars_per_token(model)
    rng = random.Random(7)
    with local_servers(model, EngineSettings(), [cpu_sglang_env()], [out / "server.log"]) as [server]:
        url = f"http://127.0.0.1:{server.port}"
        warm_up(url, str(model))
        return Counter(tokens_to_first_text(url, prompts.question(QUESTION_TOKENS, cpt, rng)) for _ in range(chats))


def print_table(chats: int, counts: dict[str, Counter[int | None]]) -> None:
    print(f"\n{chats} new questions a tokenizer, one at a time, {OUTPUT_TOKENS} output tokens; {EngineSettings()}")
    print("| tokenizer | first text at token 1 | 2 | 3 | 4 or later | none | mean tokens to first text |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, count in counts.items():
        later = sum(n for k, n in count.items() if k is not None and k >= 4)
        seen = {k: n for k, n in count.items() if k is not None}
        mean = f"{sum(k * n for k, n in seen.items()) / sum(seen.values()):.2f}" if seen else "—"
        shares = [count[1], count[2], count[3], later, count[None]]
        print(f"| {name} | " + " | ".join(f"{100 * n / chats:.0f}%" for n in shares) + f" | {mean} |")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.first_text", description=__doc__.split("\n\n")[0])
    ap.add_argument("--chats", type=int, default=100, help="Questions a tokenizer.")
    args = ap.parse_args(argv)
    if args.chats < 1:
        ap.error(f"--chats {args.chats} must be at least 1")
    return args


@records("first-text", "Tokens to a stream's first text on the tiny model, by tokenizer")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    counts: dict[str, Counter[int | None]] = {}
    with tempfile.TemporaryDirectory(prefix="first-text-") as tmp:
        for i, (name, build) in enumerate(MODELS.items()):
            folder = Path(tmp) / str(i)
            model = build(folder / "model", EngineSettings().context_tokens)
            counts[name] = measure(model, args.chats, folder)
            print(f"{name}: {sorted(counts[name].items(), key=str)}", flush=True)
    print_table(args.chats, counts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
