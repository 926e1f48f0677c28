"""What the front costs per request: every front run as a user runs it, measured side by side in one run.

Fronts, all up at once, measured in phases that alternate (the order reversed every round):

- `fairshare/haproxy`: `serve run` of config.card12gb.yaml as shipped (Serve's high-throughput front: HAProxy,
  direct ingress), with `time_scale: 0`, so the sim engine costs nothing and all that is measured is serving;
- `echo/haproxy`: a bare Serve FastAPI app in the same Serve, writing the same SSE chunks itself;
- `fairshare/proxy`, `echo/proxy`: the same two in a second `serve run`, under Serve's Python proxy
  (`serve_path.PYTHON_PROXY_ENV` in both places: the switch the configs document);
- `sglang-router` (unless `--no-sglang`): `sglang-router` before one stock sglang HTTP server (the plugin off) on the
  tiny random-weight CPU model. An engine at zero cost is impossible there: its scheduler process, which runs the
  forward passes, is reported apart and left out of the front's CPU.

Chat phases: `--concurrency` closed-loop streams (default 50), each asking for 16 tokens. Embeddings phases:
`/v1/embeddings` of one short input at 1, 8 and 64 closed-loop clients on each Serve. Every process runs at the
priority it starts with; the load generator runs at niceness 15, below all of them, so it never outranks what it
measures.

Printed: per front, requests/s, failures, client TTFT p50/p99, and CPU milliseconds per request by process (the
front's processes summed: Serve's are the proxy or HAProxy, the replicas, the controller and Ray's own; sglang's
are the router, the server's HTTP and tokenizer process and the detokenizer); then the ratios: each app front to
the other mode, the app's front CPU per request to sglang-router's.

Usage (from the repository root): python -m benchmarks.serve_overhead [--seconds 8] [--rounds 2]
    [--concurrency 50] [--no-sglang]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import psutil
import yaml
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from ray import serve

from harness.local_serve import with_free_haproxy_ports
from harness.net import free_port, listener
from harness.results import records
from harness.serve_run import REPO, ServeRun
from serve_app.config.serve_path import FRONT_ENV, PYTHON_PROXY_ENV

MAX_TOKENS = 16
CONTENT = re.compile(rb'"content":"[^"]')
CONFIG_FILE = REPO / "config.card12gb.yaml"
echo_api = FastAPI()


def _events(model: str, texts: list[str]) -> str:
    """The echo's SSE events: a role chunk, one chunk per text, [DONE] (json.dumps: no pydantic, bare)."""
    base = {"id": "chatcmpl-echo", "object": "chat.completion.chunk", "created": 0, "model": model}
    events = ["data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}) + "\n\n"]
    for text in texts:
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
        events.append("data: " + json.dumps({**base, "choices": [choice]}) + "\n\n")
    return "".join(events) + "data: [DONE]\n\n"


@serve.deployment(name="Echo", max_ongoing_requests=1024)
@serve.ingress(echo_api)
class Echo:
    @echo_api.post("/v1/chat/completions")
    async def chat(self, body: dict) -> StreamingResponse:
        n = int(body.get("max_tokens", MAX_TOKENS))
        return StreamingResponse(
            iter([_events(body.get("model", ""), [f"w{i} " for i in range(n)])]), media_type="text/event-stream"
        )


echo = Echo.bind()
"""The bare echo, as a config's `import_path` names it (`benchmarks.serve_overhead:echo`)."""


def serve_config(front_env: dict[str, str]) -> dict[str, Any]:
    """config.card12gb.yaml with `front_env` in both places, the engines at zero cost, and the echo beside it."""
    cfg = copy.deepcopy(yaml.safe_load(CONFIG_FILE.read_text()))
    cfg["http_options"]["port"] = free_port()
    cfg["controller_options"]["runtime_env"]["env_vars"].update(front_env)
    cfg["controller_options"] = with_free_haproxy_ports(cfg["controller_options"])
    app = cfg["applications"][0]
    app["runtime_env"]["env_vars"].update(front_env)
    engine = next(d for d in app["deployments"] if d["name"] == "Engine")
    engine["user_config"]["time_scale"] = 0.0
    echo_app = {
        "name": "echo",
        "route_prefix": "/echo",
        "import_path": "benchmarks.serve_overhead:echo",
        "runtime_env": copy.deepcopy(app["runtime_env"]),
        # Logical CPUs only (every process shares the cores): the app and the echo fit the machine's count.
        "deployments": [{"name": "Echo", "ray_actor_options": {"num_cpus": 0.05}}],
    }
    cfg["applications"].append(echo_app)
    return cfg


class Front:
    """One front under load: where to send, and what its processes cost (CPU seconds by role so far)."""

    def __init__(self, name: str, url: str, model: str, cpu: Callable[[], dict[str, float]], engine_roles=()):
        self.name, self.url, self.model, self.cpu = name, url, model, cpu
        self.engine_roles = set(engine_roles)
        """Roles that are the engine, not the front (left out of the front's CPU)."""
        self.runs: dict[str, Any] = {"ok": 0, "errors": 0, "elapsed_s": 0.0, "ttft": [], "cpu_s": {}, "kinds": {}}


async def _chat(session: aiohttp.ClientSession, front: Front, i: int, out: dict) -> None:
    body = {"model": front.model, "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": MAX_TOKENS}
    t0 = time.perf_counter()
    ttft = None
    async with session.post(f"{front.url}/v1/chat/completions", json={**body, "stream": True}) as r:
        if r.status != 200:
            out["errors"] += 1
            out["kinds"][str(r.status)] = out["kinds"].get(str(r.status), 0) + 1
            await r.read()
            return
        async for data in r.content.iter_any():
            if ttft is None and CONTENT.search(data):
                ttft = time.perf_counter() - t0
    out["ok"] += 1
    out["ttft"].append(ttft if ttft is not None else time.perf_counter() - t0)


async def _embed(session: aiohttp.ClientSession, front: Front, i: int, out: dict) -> None:
    async with session.post(f"{front.url}/v1/embeddings", json={"model": front.model, "input": f"text {i}"}) as r:
        await r.read()
        out["ok" if r.status == 200 else "errors"] += 1
        if r.status != 200:
            out["kinds"][str(r.status)] = out["kinds"].get(str(r.status), 0) + 1


async def _closed_loop(front: Front, one, seconds: float, concurrency: int) -> dict:
    out: dict[str, Any] = {"ok": 0, "errors": 0, "ttft": [], "kinds": {}}
    stop_at = time.perf_counter() + seconds
    conn = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def worker(w: int) -> None:
            i = w
            while time.perf_counter() < stop_at:
                try:
                    await one(session, front, i, out)
                except (aiohttp.ClientError, TimeoutError) as e:  # a failure the table counts, by kind
                    out["errors"] += 1
                    out["kinds"][type(e).__name__] = out["kinds"].get(type(e).__name__, 0) + 1
                i += concurrency

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        out["elapsed_s"] = time.perf_counter() - t0
    return out


def measure(front: Front, one, seconds: float, concurrency: int) -> None:
    """One saturated phase, added to the front's runs with the CPU each of its roles spent in it."""
    before = front.cpu()
    out = asyncio.run(_closed_loop(front, one, seconds, concurrency))
    after = front.cpu()
    runs = front.runs
    for k in ("ok", "errors", "elapsed_s"):
        runs[k] += out[k]
    runs["ttft"] += out["ttft"]
    for kind, n in out["kinds"].items():
        runs["kinds"][kind] = runs["kinds"].get(kind, 0) + n
    print(f"  {front.name}: {out['ok']} answered, {out['errors']} failed {out['kinds'] or ''}", flush=True)
    for role, s in after.items():
        runs["cpu_s"][role] = runs["cpu_s"].get(role, 0.0) + max(0.0, s - before.get(role, 0.0))


def serve_fronts(run: ServeRun, mode: str, cfg: dict[str, Any]) -> list[Front]:
    """The chat app, the echo and the embeddings of one Serve; each phase's CPU is the whole Serve's less the other
    apps' replicas (idle in that phase)."""
    args = cfg["applications"][0]["args"]
    model = "sim-" + args["sim"]["preset"]
    embedding_model = args["embeddings"]["model_id"]

    def cpu(*replicas: str) -> Callable[[], dict[str, float]]:
        keep = {"proxy", "controller", "ray", *replicas}
        return lambda: {r: s for r, s in run.cpu_by_role().items() if r in keep}

    return [
        Front(f"fairshare/{mode}", run.url, model, cpu("fairshare/Ingress", "fairshare/Engine")),
        Front(f"echo/{mode}", run.url + "/echo", model, cpu("echo/Echo")),
        Front(f"embeddings/{mode}", run.url, embedding_model, cpu("fairshare/Ingress", "fairshare/Embedder")),
    ]


def sglang_role(process: psutil.Process) -> str:
    """A stock server's process by its title: `scheduler` (the forward passes), `detokenizer`, or the server's own
    HTTP and tokenizer process."""
    name = process.name()
    return name.removeprefix("sglang::") if name.startswith("sglang::") else "http+tokenizer"


@contextlib.contextmanager
def sglang_front(log_dir: Path) -> Iterator[Front]:
    """sglang-router (round robin) before one stock sglang server on the tiny CPU model, the plugin off."""
    from harness.cpu_env import CPU_SERVER_ARGS, cpu_sglang_env
    from harness.sglang_server import LocalServer
    from harness.tiny_model import TinyModelSpec, build_tiny_model
    from loadtests.peers import launch_router, model_id

    with tempfile.TemporaryDirectory(prefix="serve-overhead-model-") as tmp:
        model = build_tiny_model(Path(tmp), TinyModelSpec(byte_level=True, max_position_embeddings=4096))
        args = [*CPU_SERVER_ARGS, "--context-length", "4096", "--max-running-requests", "64", "--log-level", "warning"]
        server = LocalServer(model, args, cpu_sglang_env(plugin_enabled=False), log_dir / "sglang.server.log")
        with server, launch_router("round_robin", [f"http://127.0.0.1:{server.port}"], log_dir) as url:
            assert server.proc is not None
            roots = [psutil.Process(server.proc.pid)]
            router = listener(int(url.rsplit(":", 1)[1]))  # found by its socket: it retitles itself sglang::router
            assert router is not None, "sglang-router's process was not found"
            routers = [router]

            def cpu() -> dict[str, float]:
                out: dict[str, float] = {}
                for root in [*roots, *routers]:
                    for p in [root, *root.children(recursive=True)]:
                        with contextlib.suppress(psutil.NoSuchProcess):
                            t = p.cpu_times()
                            name = "router" if root in routers else sglang_role(p)
                            out[name] = out.get(name, 0.0) + t.user + t.system
                return out

            yield Front(
                "sglang-router", url, model_id(f"http://127.0.0.1:{server.port}"), cpu, engine_roles=("scheduler",)
            )


def front_cpu_ms(front: Front) -> float:
    """The front's CPU milliseconds per answered request: every role but the engine's."""
    runs = front.runs
    return 1e3 * sum(s for r, s in runs["cpu_s"].items() if r not in front.engine_roles) / max(runs["ok"], 1)


def report(fronts: list[Front]) -> None:
    print(f"{'front':>22} {'req/s':>7} {'failed':>6} {'TTFT p50':>9} {'p99':>7} {'front CPU ms/req':>16}  by process")
    for f in fronts:
        runs = f.runs
        ttft = np.asarray(runs["ttft"]) * 1e3
        p50, p99 = (f"{np.percentile(ttft, q):.0f}ms" if len(ttft) else "-" for q in (50, 99))
        by_role = ", ".join(f"{r} {1e3 * s / max(runs['ok'], 1):.2f}" for r, s in sorted(runs["cpu_s"].items()))
        print(
            f"{f.name:>22} {runs['ok'] / max(runs['elapsed_s'], 1e-9):7.1f} {runs['errors']:6d} "
            f"{p50:>9} {p99:>7} {front_cpu_ms(f):16.2f}  {by_role}"
        )
    failures = {f.name: f.runs["kinds"] for f in fronts if f.runs["kinds"]}
    print(f"failures by kind (HTTP status or client error): {failures or 'none'}")
    by_name = {f.name: f for f in fronts}

    def rps(name: str) -> float:
        runs = by_name[name].runs
        return runs["ok"] / max(runs["elapsed_s"], 1e-9)

    print("ratios (same run):")
    for app in ("fairshare", "echo", "embeddings@1", "embeddings@8", "embeddings@64"):
        name, _, clients = app.partition("@")
        ha, px = (f"{name}/{mode}" + (f"@{clients}" if clients else "") for mode in ("haproxy", "proxy"))
        if ha in by_name and px in by_name:
            print(
                f"  {app}: haproxy / proxy requests/s {rps(ha) / rps(px):.2f}x, CPU per request "
                f"{front_cpu_ms(by_name[ha]) / front_cpu_ms(by_name[px]):.2f}x"
            )
    if "sglang-router" in by_name:
        ref = front_cpu_ms(by_name["sglang-router"])
        for name in ("fairshare/haproxy", "fairshare/proxy"):
            print(f"  {name} front CPU per request / sglang-router's: {front_cpu_ms(by_name[name]) / ref:.2f}x")


@records(
    "serve-overhead",
    "What the front costs per request: this app and a bare Serve app in both Serve fronts, and sglang-router",
)
def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.serve_overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each measured phase")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the fronts")
    ap.add_argument("--concurrency", type=int, default=50, help="closed-loop chat streams")
    ap.add_argument("--no-sglang", action="store_true", help="leave out sglang-router before a stock sglang server")
    args = ap.parse_args()

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="serve-overhead-") as logs, contextlib.ExitStack() as stack:
        log_dir = Path(logs)
        chat: list[Front] = []
        embeddings: list[tuple[Front, int]] = []
        for mode, env in (("haproxy", FRONT_ENV), ("proxy", PYTHON_PROXY_ENV)):
            cfg = serve_config(env)
            run = stack.enter_context(ServeRun(mode, cfg, log_dir, ready_paths=("/health", "/echo/docs")))
            app, echo_front, embed = serve_fronts(run, mode, cfg)
            chat += [app, echo_front]
            for clients in (1, 8, 64):
                f = Front(f"{embed.name}@{clients}", embed.url, embed.model, embed.cpu)
                embeddings.append((f, clients))
        if not args.no_sglang:
            chat.append(stack.enter_context(sglang_front(log_dir)))
        os.nice(15)  # below every front's process
        for f in chat:  # warm every path
            asyncio.run(_closed_loop(f, _chat, 1.0, 4))
        for r in range(args.rounds):
            for f in chat if r % 2 == 0 else chat[::-1]:
                measure(f, _chat, args.seconds, args.concurrency)
            for f, clients in embeddings if r % 2 == 0 else embeddings[::-1]:
                measure(f, _embed, args.seconds / 2, clients)
        load_after = os.getloadavg()
    print(f"serve overhead: {args.concurrency} concurrent chat streams of {MAX_TOKENS} tokens; {os.cpu_count()} CPUs")
    print(
        f"  phases of {args.seconds:g} s (embeddings {args.seconds / 2:g} s), {args.rounds} rounds, order reversed each"
    )
    print("  load average (1/5/15 min): " + "/".join(f"{x:.1f}" for x in load_before) + " at start, "
          + "/".join(f"{x:.1f}" for x in load_after) + " after")  # fmt: skip
    report([*chat, *(f for f, _ in embeddings)])


if __name__ == "__main__":
    main()
