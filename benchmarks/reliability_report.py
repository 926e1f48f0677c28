"""Reliability report: an overload burst, an engine replica kill and a disconnect storm, then the tally.

    python -m benchmarks.reliability_report            # starts its own sim deployment on 127.0.0.1
    python -m benchmarks.reliability_report --url URL  # an app already running (no replica kill then)

Every request ends in exactly one of:

- **answered**: a complete response (JSON with a finish reason; a stream with a finishing chunk
  and `[DONE]`);
- **shed**: 429 or 503 with OpenAI's error body (counted by status);
- **failed**: any other explicit error (an HTTP error with OpenAI's error body, or an SSE `error`
  event on a stream), counted by its code;
- **cancelled**: the client (this command, in the disconnect storm) went away on purpose;
- **lost**: sent, not cancelled, and ended by neither a complete response nor an explicit error:
  a stream cut without `[DONE]` or an error event, a connection reset, a timeout, an error status
  without OpenAI's body. `lost` must be 0; the command exits 1 otherwise.

Bounded: fixed request counts, a per-request timeout and an overall deadline; loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from harness import local_serve
from harness.net import free_port
from harness.results import records

ANSWERED, SHED, FAILED, CANCELLED, LOST = "answered", "shed", "failed", "cancelled", "lost"
CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: str
    detail: str = ""
    """Shed: the status; failed: the error code; lost: why."""


def _error_code(body: Any) -> str | None:
    """The code (or type) of OpenAI's error body, None if `body` is not one."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        if isinstance(err.get("message"), str):
            return str(err.get("code") or err.get("type") or "error")
    return None


def classify_response(status: int, body: bytes) -> Outcome:
    """A whole (non-streamed) HTTP response."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if status == 200:
        choices = data.get("choices") if isinstance(data, dict) else None
        if choices and choices[0].get("finish_reason"):
            return Outcome(ANSWERED)
        return Outcome(LOST, "200-without-finish")
    code = _error_code(data)
    if code is None:
        return Outcome(LOST, f"{status}-without-error-body")
    if status in (429, 503):
        return Outcome(SHED, str(status))
    return Outcome(FAILED, f"{status}:{code}")


def classify_stream(events: Sequence[str]) -> Outcome:
    """The `data:` payloads of a 200 event stream, in order, as far as it went."""
    finished = done = False
    error: str | None = None
    for payload in events:
        if payload == "[DONE]":
            done = True
            continue
        try:
            data = json.loads(payload)
        except ValueError:
            continue
        code = _error_code(data)
        if code is not None:
            error = code
        elif any(c.get("finish_reason") for c in data.get("choices") or ()):
            finished = True
    if error is not None:
        return Outcome(FAILED, f"stream:{error}" + ("" if done else "+no-done"))
    if finished and done:
        return Outcome(ANSWERED)
    return Outcome(LOST, "stream-cut" if events else "stream-empty")


@dataclass
class Tally:
    outcomes: list[tuple[str, Outcome]] = field(default_factory=list)

    def add(self, scenario: str, outcome: Outcome) -> None:
        self.outcomes.append((scenario, outcome))

    def count(self, kind: str, scenario: str | None = None) -> int:
        return sum(o.kind == kind and (scenario is None or s == scenario) for s, o in self.outcomes)

    def by_detail(self, kind: str) -> Counter[str]:
        return Counter(o.detail for _, o in self.outcomes if o.kind == kind)

    @property
    def lost(self) -> int:
        return self.count(LOST)


# -- requests ----------------------------------------------------------------------------------
def chat_body(model: str, i: int, *, max_tokens: int, stream: bool, doc_tokens: int = 0) -> dict[str, Any]:
    text = f"Question {i}: is the service still answering?"
    if doc_tokens:
        text = "lorem " * (doc_tokens * CHARS_PER_TOKEN // 6) + text
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


class StreamWatch:
    """Where a stream runs (its `X-Replica`), known at its first event; `done` once it started or ended."""

    def __init__(self) -> None:
        self.replica = ""
        self.done = asyncio.Event()


async def send(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], session: str, watch: StreamWatch | None = None
) -> Outcome:
    """One request to its end."""
    try:
        return await _send(client, url, body, session, watch)
    finally:
        if watch is not None:
            watch.done.set()


async def _send(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], session: str, watch: StreamWatch | None
) -> Outcome:
    headers = {"X-Session-ID": session}
    try:
        if not body["stream"]:
            r = await client.post(url, json=body, headers=headers)
            return classify_response(r.status_code, r.content)
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                return classify_response(r.status_code, await r.aread())
            events = []
            try:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        if watch is not None and not watch.done.is_set():
                            watch.replica = r.headers.get("x-replica", "")
                            watch.done.set()
            except httpx.HTTPError:
                pass  # cut mid-stream: classified by what arrived
            return classify_stream(events)
    except httpx.TimeoutException:
        return Outcome(LOST, "timeout")
    except httpx.HTTPError as e:
        return Outcome(LOST, type(e).__name__)


async def send_and_leave(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], session: str
) -> tuple[Outcome, str]:
    """Open a stream, read its first event, go away. Returns the outcome and the replica."""
    try:
        async with client.stream("POST", url, json=body, headers={"X-Session-ID": session}) as r:
            if r.status_code != 200:
                return classify_response(r.status_code, await r.aread()), ""
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    return Outcome(CANCELLED), r.headers.get("x-replica", "")
            return Outcome(LOST, "stream-empty"), ""
    except httpx.HTTPError as e:
        return Outcome(LOST, type(e).__name__), ""


# -- scenarios ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    model: str = local_serve.CARD12GB_MODEL
    burst_requests: int = 48
    burst_doc_every: int = 8
    """One request in this many of the burst is a document of `doc_tokens`."""
    doc_tokens: int = 12_000
    kill_streams: int = 16
    kill_after_kill: int = 16
    disconnect_streams: int = 24
    max_tokens: int = 200
    request_timeout_s: float = 90.0
    settle_timeout_s: float = 30.0


async def overload(client: httpx.AsyncClient, base: str, plan: Plan, tally: Tally) -> None:
    url = f"{base}/v1/chat/completions"

    def body(i: int) -> dict[str, Any]:
        doc = plan.doc_tokens if i % plan.burst_doc_every == 0 else 0
        return chat_body(plan.model, i, max_tokens=plan.max_tokens // 2, stream=i % 2 == 0, doc_tokens=doc)

    outcomes = await asyncio.gather(*(send(client, url, body(i), f"burst-{i}") for i in range(plan.burst_requests)))
    for o in outcomes:
        tally.add("overload", o)


async def replica_kill(client: httpx.AsyncClient, base: str, plan: Plan, tally: Tally) -> str:
    """Streams in flight, the engine replica serving most of them killed; then more requests while it restarts."""
    url = f"{base}/v1/chat/completions"
    watches = [StreamWatch() for _ in range(plan.kill_streams)]
    long_answer = plan.max_tokens * 5  # outlives the kill
    streams = [
        asyncio.create_task(
            send(client, url, chat_body(plan.model, i, max_tokens=long_answer, stream=True), f"kill-{i}", w)
        )
        for i, w in enumerate(watches)
    ]
    # Every stream under way (or already ended, e.g. shed) before the kill.
    await asyncio.wait_for(asyncio.gather(*(w.done.wait() for w in watches)), plan.request_timeout_s)
    on = Counter(w.replica for w in watches if w.replica)
    if not on:
        raise RuntimeError("no stream started: nothing to kill under load")
    victim, num_streams = on.most_common(1)[0]
    await asyncio.to_thread(kill_replica, victim)
    short = plan.max_tokens // 4
    after = [
        asyncio.create_task(
            send(client, url, chat_body(plan.model, i, max_tokens=short, stream=i % 2 == 0), f"after-{i}")
        )
        for i in range(plan.kill_after_kill)
    ]
    for o in await asyncio.gather(*streams):
        tally.add("replica-kill", o)
    for o in await asyncio.gather(*after):
        tally.add("after-kill", o)
    return f"{victim} (serving {num_streams} of the {plan.kill_streams} streams)"


async def disconnect_storm(client: httpx.AsyncClient, base: str, plan: Plan, tally: Tally) -> dict[str, int]:
    """Streams abandoned after their first event; then every replica's engine must be empty again."""
    url = f"{base}/v1/chat/completions"
    results = await asyncio.gather(
        *(
            send_and_leave(
                client, url, chat_body(plan.model, i, max_tokens=plan.max_tokens * 10, stream=True), f"storm-{i}"
            )
            for i in range(plan.disconnect_streams)
        )
    )
    replicas = {rep for _, rep in results if rep}
    for o, _ in results:
        tally.add("disconnect-storm", o)
    leaked: dict[str, int] = {}
    deadline = time.monotonic() + plan.settle_timeout_s
    for rep in sorted(replicas):
        while True:
            info = (await client.get(f"{base}/admin/replicas/{rep}")).json()
            active = len(info.get("active_request_ids", ()))
            if (active == 0 and info.get("kv_used_tokens", 0) == 0) or time.monotonic() > deadline:
                leaked[rep] = active
                break
            await asyncio.sleep(0.25)
    return leaked


async def probe(client: httpx.AsyncClient, base: str, plan: Plan, tally: Tally, scenario: str) -> None:
    """One plain request after a scenario: the service still answers."""
    o = await send(
        client, f"{base}/v1/chat/completions", chat_body(plan.model, 0, max_tokens=8, stream=False), f"probe-{scenario}"
    )
    tally.add(f"probe:{scenario}", o)


# -- running it --------------------------------------------------------------------------------
def report_config(port: int) -> dict[str, Any]:
    """config.yaml, small: two engine replicas (long lane, chat lane) with tight limits and a fast clock."""
    cfg = local_serve.app_config(port, num_replicas=2, time_scale=0.05)
    cfg["applications"][0]["args"]["sim"]["natural_output_tokens"] = 4096
    engine = local_serve.deployment(cfg, "Engine")
    engine["max_ongoing_requests"] = 8
    engine["max_queued_requests"] = 8
    engine["ray_actor_options"] = {"num_cpus": 0.1}
    engine["graceful_shutdown_timeout_s"] = 5
    engine["health_check_period_s"] = 1
    local_serve.deployment(cfg, "Ingress")["ray_actor_options"] = {"num_cpus": 0.1}
    return cfg


REPLICA_ACTOR_PREFIX = f"SERVE_REPLICA::{local_serve.APP}#Engine#"


def engine_replicas() -> dict[str, tuple[str, str]]:
    """Engine replica id -> (actor name, namespace), from Ray's named actors."""
    import ray

    return {
        a["name"].removeprefix(REPLICA_ACTOR_PREFIX): (a["name"], a["namespace"])
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(REPLICA_ACTOR_PREFIX)
    }


def kill_replica(replica_id: str) -> None:
    """`ray.kill` one engine replica actor; Serve notices and starts a new one."""
    import ray

    replicas = engine_replicas()
    if replica_id not in replicas:
        raise RuntimeError(f"no Engine replica actor {replica_id!r} (have {sorted(replicas)})")
    name, namespace = replicas[replica_id]
    ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)


async def run(base: str, plan: Plan, can_kill: bool) -> tuple[Tally, dict[str, Any]]:
    tally = Tally()
    facts: dict[str, Any] = {}
    timeout = httpx.Timeout(plan.request_timeout_s, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=256)) as client:
        plan = dataclasses.replace(plan, model=(await client.get(f"{base}/v1/models")).json()["data"][0]["id"])
        await overload(client, base, plan, tally)
        await probe(client, base, plan, tally, "overload")
        if can_kill:
            facts["killed_replica"] = await replica_kill(client, base, plan, tally)
            await probe(client, base, plan, tally, "replica-kill")
        else:
            facts["killed_replica"] = "skipped (--url: this command did not start the deployment)"
        facts["engine_requests_left_after_storm"] = await disconnect_storm(client, base, plan, tally)
        await probe(client, base, plan, tally, "disconnect-storm")
    return tally, facts


def print_report(tally: Tally, facts: dict[str, Any], elapsed_s: float) -> None:
    from rich.console import Console
    from rich.table import Table

    scenarios = list(dict.fromkeys(s for s, _ in tally.outcomes))
    table = Table(title=f"Reliability report ({elapsed_s:.0f} s)")
    for col in ("scenario", "sent", ANSWERED, SHED, FAILED, CANCELLED, LOST):
        table.add_column(col, justify="left" if col == "scenario" else "right")
    for s in [*scenarios, None]:
        sent = sum(s is None or sc == s for sc, _ in tally.outcomes)
        counts = [str(tally.count(k, s)) for k in (ANSWERED, SHED, FAILED, CANCELLED, LOST)]
        table.add_row(s or "all", str(sent), *counts, end_section=s == scenarios[-1])
    console = Console()
    console.print(table)
    console.print(f"shed by status:   {dict(sorted(tally.by_detail(SHED).items()))}")
    console.print(f"failed by reason: {dict(sorted(tally.by_detail(FAILED).items()))}")
    console.print(f"lost by reason:   {dict(sorted(tally.by_detail(LOST).items()))}")
    for k, v in facts.items():
        console.print(f"{k}: {v}")
    console.print(f"lost = {tally.lost}" + ("" if tally.lost == 0 else "  (must be 0)"))


@records("reliability-report", "Reliability under faults and overload: every request answered, shed or failed")
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="base URL of a running app (loopback); default: start one here")
    ap.add_argument("--burst", type=int, default=Plan.burst_requests, help="requests in the overload burst")
    ap.add_argument("--streams", type=int, default=Plan.kill_streams, help="streams in flight at the replica kill")
    ap.add_argument("--storm", type=int, default=Plan.disconnect_streams, help="streams in the disconnect storm")
    ap.add_argument("--deadline-s", type=float, default=600.0, help="stop the whole run after this long")
    args = ap.parse_args(argv)
    for name in ("burst", "streams", "storm"):
        if not 1 <= getattr(args, name) <= 1000:
            ap.error(f"--{name} must be between 1 and 1000 (got {getattr(args, name)})")
    if args.url and httpx.URL(args.url).host not in {"127.0.0.1", "localhost", "::1"}:
        ap.error(f"--url must be a loopback address (got {args.url!r})")
    plan = Plan(burst_requests=args.burst, kill_streams=args.streams, disconnect_streams=args.storm)
    started = time.monotonic()
    if args.url:
        base, owned = args.url.rstrip("/"), False
    else:
        port = free_port()
        base, owned = f"http://127.0.0.1:{port}", True
        local_serve.start(port)
        local_serve.deploy(report_config(port))
    try:
        tally, facts = asyncio.run(asyncio.wait_for(run(base, plan, can_kill=owned), args.deadline_s))
    finally:
        if owned:
            local_serve.stop()
    print_report(tally, facts, time.monotonic() - started)
    return 0 if tally.lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
