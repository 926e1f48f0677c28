"""The embeddings service under load: throughput and p99 at 1, 8 and 64 concurrent clients, then a burst.

A local Ray + Serve on 127.0.0.1 runs `config.card12gb.yaml` as shipped (its `Embedder` deployment: the sim
embeddings model, Serve's dynamic batching, `max_ongoing_requests` 64, `max_queued_requests` 256). Each
request embeds one short text.

1. Closed loop: `c` clients each send their next request when the last one is answered, for `--seconds`;
   printed: embeddings/s and p50/p99 latency per `c`.
2. Burst: `--burst` requests sent at once (well over the configured limit of ongoing + queued requests);
   printed: sent / answered (200) / shed (429 with Retry-After) / failed (anything else: a 5xx, a timeout,
   a reset connection). The service is stable when failed = 0: what it cannot take now it sheds at once.

Usage (from the repository root): python -m benchmarks.embeddings_load [--seconds 6] [--burst 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter

import aiohttp

from harness import local_serve as sc
from harness.net import free_port
from harness.results import records

MODEL = "sim-embedding"
CONCURRENCY = (1, 8, 64)


async def _one(session: aiohttp.ClientSession, url: str, text: str) -> tuple[int, float, bool]:
    """(status, seconds, has Retry-After); status 0 for a transport failure or timeout."""
    start = time.perf_counter()
    try:
        async with session.post(url, json={"model": MODEL, "input": text, "encoding_format": "float"}) as r:
            await r.read()
            return r.status, time.perf_counter() - start, "Retry-After" in r.headers
    except (TimeoutError, aiohttp.ClientError):
        return 0, time.perf_counter() - start, False


async def closed_loop(url: str, clients: int, seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    deadline = time.perf_counter() + seconds

    async def client(session: aiohttp.ClientSession, k: int) -> None:
        i = 0
        while time.perf_counter() < deadline:
            status, dt, _ = await _one(session, url, f"client {k} text {i}")
            statuses[status] += 1
            if status == 200:
                latencies.append(dt)
            i += 1

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=clients)) as session:
        start = time.perf_counter()
        await asyncio.gather(*(client(session, k) for k in range(clients)))
        elapsed = time.perf_counter() - start
    return {
        "clients": clients,
        "embeddings_per_s": len(latencies) / elapsed,
        "p50_ms": sc.pct(latencies, 50) * 1000,
        "p99_ms": sc.pct(latencies, 99) * 1000,
        "non_200": sum(n for s, n in statuses.items() if s != 200),
    }


async def burst(url: str, n: int) -> dict[str, int]:
    timeout = aiohttp.ClientTimeout(total=300)
    connector = aiohttp.TCPConnector(limit=0)  # every request on its own connection, all at once
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        results = await asyncio.gather(*(_one(session, url, f"burst {i}") for i in range(n)))
    answered = sum(1 for s, _, _ in results if s == 200)
    shed = sum(1 for s, _, retry in results if s == 429 and retry)
    return {"sent": n, "answered": answered, "shed": shed, "failed": n - answered - shed}


@records("embeddings-load", "Embeddings under closed-loop load and a burst: throughput, latency, shed, failed")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.embeddings_load")
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each closed-loop phase")
    parser.add_argument("--burst", type=int, default=10_000, help="requests sent at once in the burst")
    args = parser.parse_args(argv)
    port = free_port()
    cfg = sc.app_config(port, num_replicas=1, time_scale=0.0)
    sc.start(port)
    try:
        sc.deploy(cfg)
        embedder = sc.deployment(cfg, "Embedder")
        url = f"http://127.0.0.1:{port}/v1/embeddings"
        print(
            f"Embedder: {embedder['num_replicas']} replica, max_ongoing_requests {embedder['max_ongoing_requests']}, "
            f"max_queued_requests {embedder['max_queued_requests']}"
        )
        rows = [asyncio.run(closed_loop(url, c, args.seconds)) for c in CONCURRENCY]
        print(f"{'clients':>8} {'embeddings/s':>13} {'p50 ms':>8} {'p99 ms':>8} {'non-200':>8}")
        for r in rows:
            print(
                f"{r['clients']:>8} {r['embeddings_per_s']:>13.0f} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
                f"{r['non_200']:>8}"
            )
        b = asyncio.run(burst(url, args.burst))
        print(f"burst: sent {b['sent']}, answered {b['answered']}, shed (429) {b['shed']}, failed {b['failed']}")
        print(json.dumps({"closed_loop": rows, "burst": b}))
        return 0 if b["failed"] == 0 else 1
    finally:
        sc.stop()


if __name__ == "__main__":
    raise SystemExit(main())
