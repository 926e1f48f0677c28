"""Serving overhead of the app (ingress + lane router + engine hop), with the sim engine at zero cost.

Apps in one Serve instance on 127.0.0.1, measured in the same run, alternating phases:
- `fairshare`: config.card12gb.yaml as shipped (2 engine replicas, lanes, session routing, its Serve request-path
  settings: `serve_app/config/serve_path.py`; `--serve-defaults` drops them), `time_scale: 0`, so the engine adds no
  time and everything measured is serving overhead;
- `echo`: a bare Serve FastAPI deployment that streams the same OpenAI SSE chunks itself, on Serve's defaults
  (the reference of the issue's target);
- `echo-path`: the same echo with the app's request-path settings (what those settings give any Serve app);
- `echo-2hop`: a bare two-hop Serve app with the app's request-path settings: a FastAPI deployment that calls a
  streaming deployment (two replicas, as the app's engines) through a handle (gRPC) and writes the same SSE chunks
  from its one item (at zero engine cost the engine replica also sends one item per request: the sim backend hands
  a stream everything generated since it last looked, `serve_app/engines/sim/streams.py`). The app's ratio to it is the
  cost of our own code; its ratio to `echo` is the cost of Serve's second hop, which the app's architecture
  (engine replicas behind an ingress) pays by design.

50 concurrent client streams (closed loop), each request asks for 16 tokens. Printed:
- ingress+router added latency: the app's `Server-Timing: ttft` (ingress receipt -> engine
  replica's first item: tokenizing, routing, the handle hop; the engine costs nothing), p50/p99, and
  its `route` part (ingress receipt -> the router's decision: tokenizing and routing);
- client-side time to first token for the app and the echo and the difference of their p50/p99;
- throughput (requests/s) of each app, and the app's as a ratio to each reference's;
- CPU milliseconds per request in the throughput phase by kind of process (Serve's proxy, the app's front
  deployment, its second hop, the controller, the other apps, this load generator): on a machine whose cores
  every process shares, the throughput ratios follow these sums.

Usage (from the repository root): python -m benchmarks.serve_overhead [--seconds 8] [--rounds 2] [--concurrency 50]
    [--serve-defaults]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import re
import time

import aiohttp
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from ray import serve

from harness import local_serve as sc
from harness.net import free_port
from harness.results import records
from serve_app.config.serve_path import SERVE_PATH_ENV

MAX_TOKENS = 16
CONTENT = re.compile(rb'"content":"[^"]')
MODEL = sc.CARD12GB_MODEL
echo_api = FastAPI()
front_api = FastAPI()
REFERENCE_CPUS = {"num_cpus": 0.25}
"""Ray's logical CPUs for the added references' replicas: all of them and the app fit the 4 `local_serve.start`
declares (a replica that does not fit never starts). Logical only: every process shares the machine's cores."""


def _events(n: int, texts: list[str]) -> list[str]:
    """The echo's SSE events: a role chunk, one chunk per text, [DONE] (json.dumps: no pydantic, bare)."""
    base = {"id": "chatcmpl-echo", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
    events = ["data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}) + "\n\n"]
    for text in texts:
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
        events.append("data: " + json.dumps({**base, "choices": [choice]}) + "\n\n")
    return [*events, "data: [DONE]\n\n"]


@serve.deployment(name="Echo", max_ongoing_requests=1024, ray_actor_options={"num_cpus": 0.5})
@serve.ingress(echo_api)
class Echo:
    @echo_api.post("/v1/chat/completions")
    async def chat(self, body: dict) -> StreamingResponse:
        n = int(body.get("max_tokens", MAX_TOKENS))

        async def gen():
            for event in _events(n, [f"w{i} " for i in range(n)]):
                yield event

        return StreamingResponse(gen(), media_type="text/event-stream")


@serve.deployment(name="EchoStage", num_replicas=2, max_ongoing_requests=1024, ray_actor_options=REFERENCE_CPUS)
class EchoStage:
    """The second hop of `echo-2hop`: the tokens ready at once, as one streamed item (as a zero-cost engine);
    two replicas, as the app's engine deployment."""

    async def tokens(self, n: int):
        yield [f"w{i} " for i in range(n)]


@serve.deployment(name="EchoFront", max_ongoing_requests=1024, ray_actor_options=REFERENCE_CPUS)
@serve.ingress(front_api)
class EchoFront:
    def __init__(self, stage: serve.handle.DeploymentHandle) -> None:
        self.stage = stage.options(stream=True)

    @front_api.post("/v1/chat/completions")
    async def chat(self, body: dict) -> StreamingResponse:
        n = int(body.get("max_tokens", MAX_TOKENS))
        stream = self.stage.tokens.remote(n)
        first = await stream.__anext__()

        async def gen():
            texts = list(first)
            async for item in stream:
                texts += item
            yield "".join(_events(n, texts))

        return StreamingResponse(gen(), media_type="text/event-stream")


def _with_env(deployment: serve.Deployment, env: dict[str, str]) -> serve.Deployment:
    if not env:
        return deployment
    return deployment.options(ray_actor_options={**REFERENCE_CPUS, "runtime_env": {"env_vars": env}})


def echo_app(env: dict[str, str] | None = None) -> serve.Application:
    """The bare echo; `env`: Serve request-path settings for its replica (default: Serve's defaults)."""
    return _with_env(Echo, env or {}).bind()


def two_hop_app(env: dict[str, str]) -> serve.Application:
    return _with_env(EchoFront, env).bind(_with_env(EchoStage, env).bind())


async def one(session: aiohttp.ClientSession, url: str, i: int, out: dict) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": MAX_TOKENS}
    body["stream"] = True
    t0 = time.perf_counter()
    ttft = None
    async with session.post(url, json=body, headers={"X-Session-ID": f"bench-{i % 200}"}) as r:
        if r.status != 200:
            out["errors"] += 1
            await r.read()
            return
        timing = r.headers.get("Server-Timing", "")
        async for data in r.content.iter_any():
            if ttft is None and CONTENT.search(data):
                ttft = time.perf_counter() - t0
    out["ttft"].append(ttft if ttft is not None else time.perf_counter() - t0)
    out["e2e"].append(time.perf_counter() - t0)
    timings = sc.server_timing(timing)
    if "ttft" in timings:
        out["first_item_ms"].append(timings["ttft"])
    if "route" in timings:
        out["route_ms"].append(timings["route"])


async def phase(url: str, seconds: float, concurrency: int, think_s: float = 0.0) -> dict:
    out: dict = {"ttft": [], "e2e": [], "first_item_ms": [], "route_ms": [], "errors": 0}
    stop_at = time.perf_counter() + seconds
    conn = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def worker(w: int) -> None:
            i = w
            await asyncio.sleep(think_s * w / concurrency)  # spread the first arrivals
            while time.perf_counter() < stop_at:
                await one(session, url, i, out)
                i += concurrency
                if think_s:
                    await asyncio.sleep(think_s)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        out["elapsed_s"] = time.perf_counter() - t0
    return out


FRONT = {"fairshare": "Ingress", "echo": "Echo", "echo-path": "Echo", "echo-2hop": "EchoFront"}
"""Each app's HTTP-facing deployment; its other deployments are its second hop."""


def cpu_roles(app: str, role: str) -> str:
    """Where a Serve process's CPU goes in `app`'s phase: proxy, the app's front or second hop, Serve's controller,
    or the other apps (idle in this phase)."""
    if role in ("proxy", "controller"):
        return role
    owner, _, deployment = role.partition("/")
    if owner != app:
        return "other apps"
    return "front" if deployment.split("#")[0] == FRONT[app] else "second hop"


def measured_phase(app: str, url: str, seconds: float, concurrency: int) -> dict:
    """A saturated phase, with the CPU seconds each kind of process spent in it (`cpu_roles`; ``client``: this
    load generator)."""
    pids = sc.serve_processes()
    before, client0 = sc.cpu_seconds(pids), time.process_time()
    out = asyncio.run(phase(url, seconds, concurrency))
    after, client1 = sc.cpu_seconds(pids), time.process_time()
    cpu: dict[str, float] = {"client": client1 - client0}
    for role in pids:
        kind = cpu_roles(app, role)
        cpu[kind] = cpu.get(kind, 0.0) + max(0.0, after[role] - before[role])
    out["cpu_s"] = cpu
    return out


def merge(a: dict | None, b: dict) -> dict:
    if a is None:
        return copy.deepcopy(b)
    for k in ("ttft", "e2e", "first_item_ms", "route_ms"):
        a[k] += b[k]
    a["errors"] += b["errors"]
    a["elapsed_s"] += b["elapsed_s"]
    for kind, seconds in b.get("cpu_s", {}).items():
        a["cpu_s"][kind] = a["cpu_s"].get(kind, 0.0) + seconds
    return a


CPU_KINDS = ("proxy", "front", "second hop", "controller", "other apps", "client")


def print_cpu(saturated: dict[str, dict | None]) -> None:
    """CPU milliseconds per request by kind of process, per app (the machine's cores are what the apps share)."""
    print("  CPU ms per request (throughput phase), by process: " + ", ".join(CPU_KINDS) + ", Serve total")
    for name, run in saturated.items():
        n = len(run["e2e"])
        per = {k: 1e3 * run["cpu_s"].get(k, 0.0) / n for k in CPU_KINDS}
        serve_total = sum(v for k, v in per.items() if k not in ("client", "other apps"))
        print(f"    {name:>10}: " + "  ".join(f"{per[k]:5.2f}" for k in CPU_KINDS) + f"  | {serve_total:5.2f}")


def fmt_load(load: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.1f}" for x in load)


REFERENCES = ("echo", "echo-path", "echo-2hop")
"""The apps the app's throughput is compared with (module docstring); `echo` is the issue's target's."""


@records("serve-overhead", "Serve app overhead: ingress and router latency and CPU per request against bare Serve apps")
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each measured phase")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the apps")
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--think-s", type=float, default=1.0, help="pause between a stream's requests (latency phase)")
    ap.add_argument(
        "--serve-defaults",
        action="store_true",
        help="run the app without the config's Serve request-path settings (config/serve_path.py), as before them",
    )
    args = ap.parse_args()

    load_before = os.getloadavg()
    port = free_port()
    sc.start(port)
    # Ray runs its workers at niceness 15; the load generator must not outrank the servers it measures.
    os.nice(15)
    names = (*REFERENCES, "fairshare")
    latency: dict[str, dict | None] = dict.fromkeys(("echo", "fairshare"))
    saturated: dict[str, dict | None] = dict.fromkeys(names)
    try:
        cfg = sc.app_config(port, num_replicas=2, time_scale=0.0)
        if args.serve_defaults:
            env = cfg["applications"][0]["runtime_env"]["env_vars"]
            for name in SERVE_PATH_ENV:
                env.pop(name)
        sc.deploy(cfg)
        serve.run(echo_app(), name="echo", route_prefix="/echo")
        serve.run(echo_app(SERVE_PATH_ENV), name="echo-path", route_prefix="/echo-path")
        serve.run(two_hop_app(SERVE_PATH_ENV), name="echo-2hop", route_prefix="/echo-2hop")
        base = f"http://127.0.0.1:{port}"
        urls = {name: f"{base}/{name}/v1/chat/completions" for name in REFERENCES}
        urls["fairshare"] = f"{base}/v1/chat/completions"
        for url in urls.values():  # warm up every path
            asyncio.run(phase(url, 1.0, 4))
        for r in range(args.rounds):
            # Alternate the order too: a phase right after another app's pays for what that one left behind.
            for name in names if r % 2 == 0 else names[::-1]:
                if name in latency:
                    run = asyncio.run(phase(urls[name], args.seconds, args.concurrency, args.think_s))
                    latency[name] = merge(latency[name], run)
                run = measured_phase(name, urls[name], args.seconds, args.concurrency)
                saturated[name] = merge(saturated[name], run)
        load_after = os.getloadavg()
    finally:
        sc.stop()

    lat_app, lat_echo = latency["fairshare"], latency["echo"]
    assert lat_app and lat_echo and all(saturated.values())
    sat_app = saturated["fairshare"]
    assert sat_app
    print(f"serve overhead: {args.concurrency} concurrent streams, {MAX_TOKENS} tokens each, sim engine at zero cost")
    mode = os.environ.get("RAY_SERVE_THROUGHPUT_OPTIMIZED", "0")
    path = (
        "Serve's defaults (--serve-defaults)"
        if args.serve_defaults
        else "the config's (serve_app/config/serve_path.py)"
    )
    print(
        f"  Ray Serve mode: RAY_SERVE_THROUGHPUT_OPTIMIZED={mode}; {os.cpu_count()} CPUs shared with the load generator"
    )
    print(f"  app's request path: {path}; bare echo: Serve's defaults; echo-path and echo-2hop: the config's")
    # Other work on the machine moves every figure: the ratios to the echo, measured beside it, move least.
    print(f"  load average (1/5/15 min): {fmt_load(load_before)} at start, {fmt_load(load_after)} after the phases")
    print(
        f"latency phase ({args.concurrency} streams, {args.think_s:g} s between a stream's requests): "
        f"{len(lat_app['e2e'])} requests to the app ({lat_app['errors']} errors), {len(lat_echo['e2e'])} to echo"
    )
    print(
        f"  ingress+router added latency (Server-Timing ttft): p50 {sc.pct(lat_app['first_item_ms'], 50):.2f} ms, "
        f"p99 {sc.pct(lat_app['first_item_ms'], 99):.2f} ms   [target p50 <= 5 ms]"
    )
    print(
        f"    of which receipt -> decision (Server-Timing route): p50 {sc.pct(lat_app['route_ms'], 50):.2f} ms, "
        f"p99 {sc.pct(lat_app['route_ms'], 99):.2f} ms"
    )
    for q in (50, 99):
        a, e = sc.pct(lat_app["ttft"], q) * 1000, sc.pct(lat_echo["ttft"], q) * 1000
        print(f"  client TTFT p{q}: app {a:.1f} ms, bare echo {e:.1f} ms, added {a - e:.1f} ms")
    rps = {n: len(r["e2e"]) / r["elapsed_s"] for n, r in saturated.items() if r}
    errors = {n: r["errors"] for n, r in saturated.items() if r and r["errors"]}
    print(f"throughput phase ({args.concurrency} streams back to back): errors {errors or 0}")
    print(
        f"  app {rps['fairshare']:.1f} req/s, bare echo {rps['echo']:.1f} req/s, "
        f"ratio {rps['fairshare'] / rps['echo']:.2f}x   [target >= 0.7x]"
    )
    for name, what in (("echo-path", "the echo on the app's request path"), ("echo-2hop", "a bare two-hop Serve app")):
        print(f"  vs {what}: {rps[name]:.1f} req/s, app ratio {rps['fairshare'] / rps[name]:.2f}x")
    print(f"  Serve's second hop alone (echo-2hop / echo): {rps['echo-2hop'] / rps['echo']:.2f}x")
    print_cpu(saturated)
    for q in (50, 99):
        a, e = sc.pct(sat_app["first_item_ms"], q), sc.pct(sat_app["ttft"], q) * 1000
        print(f"  saturated: first item p{q} {a:.1f} ms, app TTFT p{q} {e:.1f} ms (queueing at full load)")


if __name__ == "__main__":
    main()
