"""Short-chat TTFT while long documents prefill: two replicas (a long lane and a chat lane) vs one.

Real time (`time_scale: 1`) on the card12gb-27b preset, config.card12gb.yaml otherwise as shipped, on 127.0.0.1:
1. a lone short chat on an idle app (the reference: one short prefill);
2. two engine replicas, lanes on: long documents arrive back to back (two in flight), a short chat
   every `--chat-interval-s`; short TTFT measured while a document prefills;
3. one engine replica (it serves both lanes), the same load.
Bounded: each loaded phase lasts `--seconds`; every request is bounded by a client timeout.

Usage (from the repository root):
    python -m benchmarks.serve_lanes [--seconds 30] [--doc-tokens 16000] [--chat-interval-s 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import time

import httpx

from harness import local_serve as sc
from harness.net import free_port
from harness.results import records

MODEL = sc.CARD12GB_MODEL
CONTENT = re.compile(r'"content":"[^"]')
DOCS_IN_FLIGHT = 2


def doc_text(num_tokens: int, i: int) -> str:
    unit = f"document {i}: the quarterly figures rose while costs fell. "
    return (unit * (num_tokens * 4 // len(unit) + 1))[: num_tokens * 4]


async def stream_ttft(client: httpx.AsyncClient, url: str, content: str, session: str, max_tokens: int) -> dict:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    t0 = time.perf_counter()
    first = None
    async with client.stream("POST", url, json=body, headers={"X-Session-ID": session}) as r:
        lane = r.headers.get("x-lane", "?")
        async for line in r.aiter_lines():
            if first is None and CONTENT.search(line):
                first = time.perf_counter()
    return {"sent": t0, "first": first or time.perf_counter(), "lane": lane}


async def loaded_phase(url: str, seconds: float, doc_tokens: int, chat_interval_s: float) -> tuple[list, list]:
    docs: list[dict] = []
    chats: list[dict] = []
    stop_at = time.perf_counter() + seconds
    async with httpx.AsyncClient(timeout=httpx.Timeout(seconds + 120)) as client:

        async def doc_worker(w: int) -> None:
            i = w
            while time.perf_counter() < stop_at:
                docs.append(await stream_ttft(client, url, doc_text(doc_tokens, i), f"doc-{i}", 1))
                i += DOCS_IN_FLIGHT

        async def chat_worker() -> None:
            await asyncio.sleep(2.0)  # let the documents start prefilling
            tasks = []
            n = 0
            while time.perf_counter() < stop_at:
                content = f"Quick question {n}: what is 2 + {n}?"
                tasks.append(asyncio.create_task(stream_ttft(client, url, content, f"chat-{n}", 2)))
                n += 1
                await asyncio.sleep(chat_interval_s)
            chats.extend(await asyncio.gather(*tasks))

        await asyncio.gather(*(doc_worker(w) for w in range(DOCS_IN_FLIGHT)), chat_worker())
    return docs, chats


def during_prefill(chats: list[dict], docs: list[dict]) -> list[float]:
    """TTFTs of chats whose wait overlapped a document's prefill (from its send to its first token)."""
    windows = [(d["sent"], d["first"]) for d in docs]
    return [c["first"] - c["sent"] for c in chats if any(c["sent"] < b and c["first"] > a for a, b in windows)]


async def lone_short(url: str, repeats: int = 5) -> list[float]:
    out = []
    async with httpx.AsyncClient(timeout=60) as client:
        for i in range(repeats):
            r = await stream_ttft(client, url, f"Quick question {i}: what is 2 + 2?", f"lone-{i}", 2)
            out.append(r["first"] - r["sent"])
            await asyncio.sleep(0.5)
    return out


@records("serve-lanes", "Short-chat TTFT while long documents prefill, through the Serve app's lanes (sim engine)")
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--doc-tokens", type=int, default=16_000)
    ap.add_argument("--chat-interval-s", type=float, default=0.5)
    args = ap.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    sc.start(port)
    os.nice(15)  # the client must not outrank the app it measures
    results = {}
    try:
        for replicas in (2, 1):
            sc.deploy(sc.app_config(port, num_replicas=replicas, time_scale=1.0))
            if replicas == 2:
                lone = asyncio.run(lone_short(url))
            docs, chats = asyncio.run(loaded_phase(url, args.seconds, args.doc_tokens, args.chat_interval_s))
            results[replicas] = (docs, chats)
            sc.delete(sc.APP)
    finally:
        sc.stop()

    print(
        f"short-chat TTFT while long documents prefill (card12gb-27b preset, real time, {DOCS_IN_FLIGHT} documents of "
        f"{args.doc_tokens} tokens in flight, a chat every {args.chat_interval_s:g} s, {args.seconds:g} s per setup)"
    )
    print(f"  lone short prefill on an idle app: p50 {sc.pct(lone, 50):.3f} s (n={len(lone)})")
    for replicas, label in ((2, "two replicas (long lane + chat lane)"), (1, "one replica (both lanes)")):
        docs, chats = results[replicas]
        ttfts = during_prefill(chats, docs)
        lanes = sorted({c["lane"] for c in chats})
        doc_ttft = [d["first"] - d["sent"] for d in docs if d["first"] - d["sent"] > 0]
        print(
            f"  {label}: short TTFT p50 {sc.pct(ttfts, 50):.3f} s, p99 {sc.pct(ttfts, 99):.3f} s, "
            f"max {max(ttfts, default=float('nan')):.3f} s (n={len(ttfts)}, chat lanes {lanes}); "
            f"document TTFT p50 {sc.pct(doc_ttft, 50):.1f} s (n={len(doc_ttft)})"
        )
    p99_two = sc.pct(during_prefill(results[2][1], results[2][0]), 99)
    print(f"  two-replica short TTFT p99 / lone short prefill: {p99_two / sc.pct(lone, 50):.2f}x")


if __name__ == "__main__":
    main()
