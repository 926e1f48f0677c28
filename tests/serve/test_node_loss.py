"""A worker node lost under load, end to end, on a multi-node Ray cluster on this machine (`harness.ray_cluster`).

The sim app's two engine replicas run one on each worker node (a replica asks for one of a worker's GPU slots, and
a node takes at most one replica); the ingress and Serve's front run on the head. Chats and documents stream; one
worker is removed while they run (its raylet and every process on it killed). Then:

- the requests still waiting for their first token on the lost replica are placed again on the live one: each
  client gets one normal, complete response, whose text has no token twice, and the re-placement counter
  (`fairshare_requests_replaced_total`) counts exactly those;
- the lost replica's started streams end with an SSE error event and `[DONE]`;
- the router routes around the lost replica at once: a new request of a session the lost replica served is
  answered within 10 s of the removal (Ray's controller notices a dead node only after its health checks);
- every request is accounted for from the client's side: answered, shed (429/503 with Retry-After) or failed
  with an explicit error; none cut, none left hanging;
- with a new worker node, Serve brings the deployment back to two replicas.

Assertions are on outcomes and counts, never on interleavings; every wait is bounded and generous (2 shared cores).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from benchmarks.reliability_report import ANSWERED, FAILED, LOST, SHED, Outcome, classify_response, classify_stream
from harness.local_serve import APP, deploy
from harness.ray_cluster import GPU_SLOT, HEAD_SLOT, LocalCluster, replicas
from serve_app.engines.sim.synthetic_text import synthetic_text
from tests.serve.conftest import DEPLOY_TIMEOUT_S, deployment, serve_test_config

pytestmark = [pytest.mark.serve, pytest.mark.slow, pytest.mark.timeout(1200)]

TIME_SCALE = 0.5
"""The simulated GPU at twice real time: a pass ~0.13 s, a 32k-token document prefills in ~11 s of wall time."""
CHATS, CHAT_TOKENS = 8, 60
DOCS, DOC_PROMPT_TOKENS, DOC_TOKENS = 3, 32_000, 8
RESTORED_S = 10.0
"""A new request is answered within this of the removal."""
STARTED_TIMEOUT_S = 120.0
STREAMS_TIMEOUT_S = 300.0
REPLACED_TIMEOUT_S = 300.0
METRIC_TIMEOUT_S = 60.0
REPLACED_METRIC = "ray_fairshare_requests_replaced_total"


def node_loss_config(port: int) -> dict[str, Any]:
    """The test app (conftest's) with two engine replicas, one per worker, lanes that follow the load, and the
    ingress and embedder on the head."""
    cfg = serve_test_config(port)
    engine = deployment(cfg, "Engine")
    engine["num_replicas"] = 2
    engine["max_replicas_per_node"] = 1
    engine["max_ongoing_requests"] = 32
    engine["max_queued_requests"] = 64
    engine["ray_actor_options"] = {"num_cpus": 0.1, "resources": {GPU_SLOT: 1}}
    # Every request waits on the engines, none on a queue limit: the outcomes are the node loss's alone.
    engine["user_config"].update(time_scale=TIME_SCALE, long_lane_replicas=None, max_queued_requests=32)
    for name in ("Ingress", "Embedder"):
        d = deployment(cfg, name)
        d["ray_actor_options"] = {**d.get("ray_actor_options", {}), "resources": {HEAD_SLOT: 1}}
    return cfg


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[LocalCluster, str]]:
    with LocalCluster(num_workers=2, slots_per_worker=2) as rc:
        port = rc.start_serve()
        deploy(node_loss_config(port), timeout_s=DEPLOY_TIMEOUT_S)
        yield rc, f"http://127.0.0.1:{port}"


# -- the client's side -------------------------------------------------------------------------------
@dataclass
class Call:
    """One streamed request as its client saw it."""

    session: str
    body: dict[str, Any]
    status: int | None = None
    retry_after: str | None = None
    replica: str = ""
    payloads: list[str] = field(default_factory=list)
    first_event_s: float | None = None
    outcome: Outcome | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)
    """Set at the first event, or at the end of a request that never streamed."""

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [json.loads(p) for p in self.payloads if p != "[DONE]"]

    @property
    def rid(self) -> str:
        """The engine's request id (every chunk's `id`): the same on the replica it was placed on again."""
        return next((c["id"] for c in self.chunks if "id" in c), "")

    @property
    def text(self) -> str:
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in self.chunks if c.get("choices"))

    @property
    def completion_tokens(self) -> int | None:
        usage = [c["usage"] for c in self.chunks if c.get("usage")]
        return usage[-1]["completion_tokens"] if usage else None


def chat_call(session: str, max_tokens: int, prompt_tokens: int = 0) -> Call:
    question = f"{session}: is the service still answering?"
    content = "lorem ipsum dolor sit amet " * (prompt_tokens * 4 // 27) + question
    body = {
        "model": "sim-card12gb-27b",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return Call(session, body)


async def read(client: httpx.AsyncClient, url: str, call: Call, timeout_s: float | None = None) -> None:
    """Send `call` and read it to its end (`timeout_s`: at most this long between reads, else the client's);
    what arrived is classified (`reliability_report`)."""
    timeout = client.timeout if timeout_s is None else httpx.Timeout(timeout_s)
    headers = {"X-Session-ID": call.session}
    try:
        async with client.stream("POST", url, json=call.body, headers=headers, timeout=timeout) as r:
            call.status = r.status_code
            call.retry_after = r.headers.get("retry-after")
            if r.status_code != 200:
                call.outcome = classify_response(r.status_code, await r.aread())
                return
            call.replica = r.headers.get("x-replica", "")
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    call.payloads.append(line.removeprefix("data: "))
                    if call.first_event_s is None:
                        call.first_event_s = time.monotonic()
                        call.started.set()
        call.outcome = classify_stream(call.payloads)
    except httpx.HTTPError as e:
        call.outcome = Outcome(LOST, type(e).__name__)
    finally:
        call.started.set()


# -- the cluster's side ------------------------------------------------------------------------------
def engine_nodes() -> dict[str, str]:
    """Running engine replica -> its node id."""
    return {r["replica_id"]: r["node_id"] for r in replicas(APP, "Engine") if r["state"] == "RUNNING"}


def replica_view(base_url: str, replica_id: str) -> dict[str, Any]:
    r = httpx.get(f"{base_url}/admin/replicas/{replica_id}", timeout=30)
    r.raise_for_status()
    return r.json()


def replaced_metric(metrics_url: str) -> float:
    text = httpx.get(metrics_url, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(REPLACED_METRIC))


@dataclass
class Removal:
    """What the test knew when it removed the victim's node."""

    victim: str
    at_s: float
    waiting: set[str]
    """Request ids the victim held that had no event at the client yet: before their first token."""
    restored_after_s: float | None = None
    probes: list[Call] = field(default_factory=list)


def choose_victim(base_url: str, calls: list[Call]) -> tuple[str, set[str]]:
    """The engine replica holding both started streams and requests still before their first token (the most of
    those), with the ids of the latter."""
    started = {c.rid for c in calls if c.first_event_s is not None}
    streaming = {c.replica for c in calls if c.first_event_s is not None and c.outcome is None}
    waiting = {rid: set(replica_view(base_url, rid)["active_request_ids"]) - started for rid in engine_nodes()}
    both = [rid for rid in waiting if rid in streaming and waiting[rid]]
    assert both, f"no replica holds both started streams and waiting requests: {waiting}, streaming on {streaming}"
    victim = max(both, key=lambda rid: len(waiting[rid]))
    return victim, waiting[victim]


async def probe_until_answered(client: httpx.AsyncClient, url: str, session: str, removal: Removal) -> None:
    """New requests of `session` (its last request was on the lost replica) until one is answered, for at most
    `RESTORED_S` after the removal; each probe is kept for the tally."""
    while (left_s := RESTORED_S - (time.monotonic() - removal.at_s)) > 0:
        probe = chat_call(session, max_tokens=1)
        removal.probes.append(probe)
        await read(client, url, probe, timeout_s=left_s)
        if probe.outcome == Outcome(ANSWERED):
            removal.restored_after_s = time.monotonic() - removal.at_s
            return
        await asyncio.sleep(0.25)


async def lose_a_node_under_load(rc: LocalCluster, base_url: str) -> tuple[list[Call], Removal]:
    url = f"{base_url}/v1/chat/completions"
    calls = [chat_call(f"doc-{i}", DOC_TOKENS, DOC_PROMPT_TOKENS) for i in range(DOCS)]
    calls += [chat_call(f"chat-{i}", CHAT_TOKENS) for i in range(CHATS)]
    async with httpx.AsyncClient(timeout=httpx.Timeout(STREAMS_TIMEOUT_S, connect=30)) as client:
        tasks = [asyncio.create_task(read(client, url, c)) for c in calls]
        chats = [c for c in calls if c.session.startswith("chat-")]
        await asyncio.wait_for(asyncio.gather(*(c.started.wait() for c in chats)), STARTED_TIMEOUT_S)
        victim, waiting = await asyncio.to_thread(choose_victim, base_url, calls)
        node = rc.worker_of(engine_nodes()[victim])
        removal = Removal(victim, time.monotonic(), waiting)
        await asyncio.to_thread(rc.remove_worker, node)
        on_victim = next(c for c in chats if c.replica == victim)
        await probe_until_answered(client, url, on_victim.session, removal)
        await asyncio.wait_for(asyncio.gather(*tasks), STREAMS_TIMEOUT_S)
    return calls, removal


def assert_accounted_for(everything: list[Call]) -> None:
    """Every request answered, shed with Retry-After, or failed with an explicit error; and no token twice, none
    skipped: each stream's text is the sim's numbered words from the first, in order."""
    summary = [(c.session, c.outcome) for c in everything]
    assert all(c.outcome is not None and c.outcome.kind in {ANSWERED, SHED, FAILED} for c in everything), summary
    assert all(c.retry_after for c in everything if c.outcome and c.outcome.kind == SHED), summary
    for c in everything:
        assert c.text == synthetic_text(0, c.text.count(" ")), (c.session, c.text)
        if c.outcome == Outcome(ANSWERED):
            assert c.completion_tokens == c.text.count(" ") == c.body["max_tokens"], (c.session, c.text)


def assert_started_streams_end_cleanly(cut: list[Call]) -> None:
    """Streams started on the lost replica: an error event, then [DONE] (or done, if one finished first)."""
    assert cut
    for c in cut:
        assert c.outcome in (Outcome(FAILED, "stream:engine_replica_lost"), Outcome(ANSWERED)), (c.session, c.outcome)
        assert c.payloads[-1] == "[DONE]", c.session
    assert any(c.outcome == Outcome(FAILED, "stream:engine_replica_lost") for c in cut)


def wait_for_metric(metrics_url: str, expected: float) -> float:
    """The re-placement counter once Ray has exported `expected` (every few seconds), or at the deadline."""
    deadline = time.monotonic() + METRIC_TIMEOUT_S
    while (value := replaced_metric(metrics_url)) != expected and time.monotonic() < deadline:
        time.sleep(1)
    return value


def wait_for_replacement(node_id: str) -> dict[str, str]:
    """The running engine replicas once two run, one of them on `node_id` (or at the deadline)."""
    deadline = time.monotonic() + REPLACED_TIMEOUT_S
    nodes = engine_nodes()
    while not (len(nodes) == 2 and node_id in nodes.values()) and time.monotonic() < deadline:
        time.sleep(1)
        nodes = engine_nodes()
    return nodes


def answer(base_url: str, call: Call) -> Call:
    async def one() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            await read(client, f"{base_url}/v1/chat/completions", call)

    asyncio.run(one())
    return call


def test_losing_a_worker_node_under_load(cluster: tuple[LocalCluster, str]) -> None:
    rc, base_url = cluster
    calls, removal = asyncio.run(lose_a_node_under_load(rc, base_url))
    summary = [(c.session, c.rid, c.replica, c.outcome) for c in calls + removal.probes]
    print(f"victim {removal.victim}, waiting {sorted(removal.waiting)}, restored after {removal.restored_after_s} s")
    print("\n".join(map(str, summary)))

    # Routed around the lost replica at once: a new request of its session answered within RESTORED_S, elsewhere.
    assert removal.restored_after_s is not None, [(p.outcome, p.replica) for p in removal.probes]
    assert removal.probes[-1].replica != removal.victim
    assert_accounted_for(calls + removal.probes)
    cut = [c for c in calls if c.replica == removal.victim]
    assert_started_streams_end_cleanly(cut)

    # Before their first token on the lost replica: placed again, and answered whole by the live one.
    replaced = [c for c in calls if c.rid in removal.waiting and c.replica != removal.victim]
    assert replaced, (removal.waiting, summary)
    assert all(c.outcome == Outcome(ANSWERED) for c in replaced), summary
    assert {c.rid for c in replaced} | {c.rid for c in cut} >= removal.waiting, (removal.waiting, summary)
    # The operator's counter says the same: the probes, sent once the node was gone, were never placed again.
    assert wait_for_metric(rc.metrics_url, len(replaced)) == len(replaced), summary

    # Capacity back: Serve places the replacement on a new worker, and it serves.
    new_node = rc.add_worker()
    nodes = wait_for_replacement(new_node.node_id)
    assert len(nodes) == 2 and new_node.node_id in nodes.values() and removal.victim not in nodes, nodes
    after = answer(base_url, chat_call("after-replacement", max_tokens=2))
    assert after.outcome == Outcome(ANSWERED), after.payloads
