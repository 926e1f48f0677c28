"""Reliability end to end: bad input, a fuzzed schema, backpressure, a disconnect storm, a replica kill.

One app for the module (see conftest). Tests assert invariants (every request answered, shed only
over the limit, no engine request left behind), never interleavings or wall-clock gaps. The replica
kill runs last: it leaves Serve replacing a replica.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections import Counter

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.reliability_report import (
    ANSWERED,
    CANCELLED,
    FAILED,
    SHED,
    Outcome,
    StreamWatch,
    chat_body,
    classify_response,
    classify_stream,
    engine_replicas,
    kill_replica,
    send,
    send_and_leave,
)
from serve_app.config import EngineKnobs
from tests.serve.conftest import ServeHandle, deployment
from tests.serve.test_serve_app import doc

pytestmark = pytest.mark.serve

SHORT = [{"role": "user", "content": "Is the service still answering?"}]
SETTLE_S = 30.0


def post(served: ServeHandle, body: bytes | dict, path: str = "/v1/chat/completions", **headers: str):
    content = json.dumps(body).encode() if isinstance(body, dict) else body
    return httpx.post(
        f"{served.base_url}{path}",
        content=content,
        headers={"content-type": "application/json", **headers},
        timeout=60,
    )


def ok_body(served: ServeHandle, **fields) -> dict:
    return {"model": served.model, "messages": SHORT, "max_tokens": 4, **fields}


def error_of(r: httpx.Response) -> dict:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def deploy_engine_knobs(served: ServeHandle, cfg: dict, timeout_s: float = SETTLE_S) -> None:
    """Deploy `cfg` and wait until every engine replica runs its `Engine.user_config`: Serve reports the app
    healthy before each replica's `reconfigure` has run."""
    served.deploy(cfg)
    expected = json.loads(EngineKnobs.model_validate(deployment(cfg, "Engine")["user_config"]).model_dump_json())
    deadline = time.monotonic() + timeout_s
    while any(served.replica(rid)["knobs"] != expected for rid in engine_replicas()):
        assert time.monotonic() < deadline, "the engine replicas never ran the deployed user_config"
        time.sleep(0.25)


def wait_until_idle(served: ServeHandle, timeout_s: float = SETTLE_S) -> dict[str, dict]:
    """Every engine replica's admin view once none holds a request (or at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        views = {rid: served.replica(rid) for rid in engine_replicas()}
        idle = all(not v["active_request_ids"] and v["kv_used_tokens"] == 0 for v in views.values())
        if idle or time.monotonic() > deadline:
            return views
        time.sleep(0.25)


# -- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "param", "fragment"),
    [
        ({"stream": "yes"}, "stream", "valid boolean (got a string)"),
        ({"max_tokens": "5"}, "max_tokens", "valid integer (got a string)"),
        ({"temperature": "0.5"}, "temperature", "valid number (got a string)"),
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"messages": []}, "messages", "at least 1 item"),
        ({"messages": None}, "messages", "valid list"),
        ({"max_tokens": 10_000_000}, "max_tokens", "does not fit this model's context window"),
    ],
)
def test_bad_fields_are_400_naming_the_field(served: ServeHandle, fields: dict, param: str, fragment: str) -> None:
    r = post(served, ok_body(served, **fields))
    assert r.status_code == 400
    err = error_of(r)
    assert err["param"] == param and fragment in err["message"]


def test_prompt_over_the_window_is_400_with_the_sizes(served: ServeHandle) -> None:
    r = post(served, ok_body(served, messages=[{"role": "user", "content": doc(270_000)}], max_tokens=100))
    err = error_of(r)
    assert r.status_code == 400 and err["code"] == "context_length_exceeded"
    assert "262144 tokens" in err["message"] and "max_tokens=100" in err["message"]


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b'{"model": "x", ', "not valid JSON"),
        (b'{"model": "\xc3\x28"}', "not valid UTF-8"),
        (b"[]", "must be a JSON object"),
        (b"", "empty"),
    ],
)
def test_bad_bodies_are_400(served: ServeHandle, raw: bytes, fragment: str) -> None:
    r = post(served, raw)
    assert r.status_code == 400 and fragment in error_of(r)["message"]


def test_oversized_body_is_413(served: ServeHandle) -> None:
    limit = 16 * 262_144  # the default: 16 bytes per context-window token
    r = post(served, b'{"model": "' + b"x" * (limit + 1) + b'"}')
    assert r.status_code == 413 and str(limit) in error_of(r)["message"]


def test_unknown_model_bad_headers_and_request_ids(served: ServeHandle) -> None:
    r = post(served, ok_body(served, model="gpt-nope"))
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"
    r = post(served, ok_body(served), **{"X-Session-ID": "x" * 300})
    assert r.status_code == 400 and error_of(r)["param"] == "X-Session-ID"
    r = post(served, ok_body(served, user="line\nbreak"))  # `user` is the session id when no header is sent
    assert r.status_code == 400 and error_of(r)["param"] == "user"
    r = post(served, ok_body(served), **{"X-Request-ID": "bad id with spaces"})
    assert r.status_code == 400 and error_of(r)["param"] == "X-Request-ID"
    r = post(served, ok_body(served), **{"X-Request-ID": "client-trace-7"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "client-trace-7"
    generated = post(served, ok_body(served)).headers["x-request-id"]
    assert generated and generated != "client-trace-7"


wrong_or_right = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 8), st.floats(allow_nan=False), st.text(max_size=12), st.just([])
)
fuzz_fields = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.text(max_size=10), st.integers(), st.just("sim-card12gb-27b")),
        "messages": st.one_of(
            wrong_or_right,
            st.lists(
                st.fixed_dictionaries(
                    {"role": st.sampled_from(["user", "assistant", "system", "robot", 3])},
                    optional={"content": st.one_of(st.text(max_size=40), wrong_or_right)},
                ),
                max_size=3,
            ),
        ),
        "max_tokens": st.one_of(wrong_or_right, st.integers(10**6, 10**9)),
        "temperature": wrong_or_right,
        "top_p": wrong_or_right,
        "n": wrong_or_right,
        "stop": st.one_of(wrong_or_right, st.lists(st.text(max_size=4), max_size=6)),
        "stream": wrong_or_right,
        "stream_options": st.one_of(wrong_or_right, st.fixed_dictionaries({"include_usage": wrong_or_right})),
        "user": wrong_or_right,
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=fuzz_fields, completions=st.booleans())
def test_fuzzed_requests_never_get_a_5xx(served: ServeHandle, fields: dict, completions: bool) -> None:
    body = {"model": served.model, "max_tokens": 4, **fields}
    if completions:
        body.pop("messages", None)
        body["prompt"] = fields.get("messages") if isinstance(fields.get("messages"), str) else "Say hi"
        path = "/v1/completions"
    else:
        body.setdefault("messages", SHORT)
        path = "/v1/chat/completions"
    r = post(served, body, path)
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        error_of(r)


def test_server_alive_after_the_fuzz(served: ServeHandle) -> None:
    assert httpx.get(f"{served.base_url}/health", timeout=10).status_code == 200
    assert post(served, ok_body(served)).status_code == 200


# -- security ----------------------------------------------------------------------------------
def test_api_key_guards_every_route_but_health(served: ServeHandle) -> None:
    key = "sk-test-reliability"
    cfg = copy.deepcopy(served.config)
    ingress = deployment(cfg, "Ingress")
    ingress["ray_actor_options"] = {
        **ingress["ray_actor_options"],
        "runtime_env": {"env_vars": {"FAIRSHARE_API_KEY": key}},
    }
    original = served.config
    served.deploy(cfg)
    try:
        _until(lambda: post(served, ok_body(served)).status_code == 401)
        r = post(served, ok_body(served), Authorization="Bearer wrong")
        assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(f"{served.base_url}/v1/models", timeout=10).status_code == 401
        assert httpx.get(f"{served.base_url}/health", timeout=10).status_code == 200
        assert post(served, ok_body(served), Authorization=f"Bearer {key}").status_code == 200
    finally:
        served.deploy(original)
    _until(lambda: post(served, ok_body(served)).status_code == 200)


def _until(check, timeout_s: float = 120.0) -> None:
    """Wait for a redeployed ingress to serve (the old replica may answer while it drains)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the redeployed ingress never answered as expected"
        time.sleep(0.5)


# -- backpressure ------------------------------------------------------------------------------
def test_queued_prefill_tokens_shed_documents_beyond_the_limit(served: ServeHandle) -> None:
    """One 100k-token document prefilling fills a 105k-token queue: three more are each answered 429."""
    doc_tokens, limit = 100_000, 105_000
    cfg = copy.deepcopy(served.config)
    engine = deployment(cfg, "Engine")
    # Real time: the first document prefills for ~70 s, far longer than the test needs.
    engine["user_config"] = {**engine["user_config"], "time_scale": 1.0, "max_queued_prefill_tokens": limit}
    original = served.config
    deploy_engine_knobs(served, cfg)
    try:
        outcomes = asyncio.run(_documents_against_a_full_queue(served, doc_tokens, n_more=3))
    finally:
        served.deploy(original)
    assert [o.status_code for o in outcomes] == [429, 429, 429]
    for r in outcomes:
        err = error_of(r)
        assert err["code"] == "rate_limit_exceeded" and "prompt tokens queued" in err["message"]
        assert 1 <= int(r.headers["retry-after"]) <= 60
    views = wait_until_idle(served)
    assert all(not v["active_request_ids"] for v in views.values())


async def _documents_against_a_full_queue(served: ServeHandle, doc_tokens: int, n_more: int) -> list[httpx.Response]:
    url = f"{served.base_url}/v1/chat/completions"
    # Its own text: nothing an earlier test sent (the window test's refused document begins like `doc`'s default)
    # may count as cached on a replica for these documents.
    content = doc(doc_tokens, seed="queued")
    body = {"model": served.model, "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    async with httpx.AsyncClient(timeout=60) as client:
        first = asyncio.create_task(client.post(url, json=body, headers={"X-Session-ID": "doc-first"}))
        try:
            await _until_a_replica_holds_a_request(served)
            more = [client.post(url, json=body, headers={"X-Session-ID": f"doc-{i}"}) for i in range(n_more)]
            return list(await asyncio.gather(*more))
        finally:
            first.cancel()  # the client goes away: the engine aborts the first document


async def _until_a_replica_holds_a_request(served: ServeHandle) -> None:
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        views = await asyncio.to_thread(lambda: [served.replica(r) for r in engine_replicas()])
        if any(v["load"]["prefill_tokens"] > 0 for v in views):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the first document never reached an engine")


def test_the_router_fills_every_allowed_replica_before_shedding(served: ServeHandle) -> None:
    """One request waiting for a first token per replica (max_queued_requests=1), 30 chats at once: every chat is
    held by a replica or shed with 429; none waits beyond the limit; and a chat is shed only once every replica,
    the long lane too (a chat spill), holds requests up to its limit."""
    num_chats, limit = 30, 1
    cfg = copy.deepcopy(served.config)
    engine = deployment(cfg, "Engine")
    # A pass lasts ~26 s of wall time: what the replicas hold stays put while the burst is answered and counted.
    engine["user_config"] = {**engine["user_config"], "time_scale": 100.0, "max_queued_requests": limit}
    engine["max_queued_requests"] = 4 * num_chats  # Serve's own queue in the handle never sheds here: ours does
    original = served.config
    deploy_engine_knobs(served, cfg)
    try:
        shed, views = asyncio.run(_chats_against_full_replicas(served, num_chats))
    finally:
        served.deploy(original)
    held = {rid: len(v["active_request_ids"]) for rid, v in views.items()}
    waiting = {rid: v["load"]["num_waiting"] + v["load"]["num_prefilling"] for rid, v in views.items()}
    assert len(shed) + sum(held.values()) == num_chats, (len(shed), held)  # none lost, none answered otherwise
    for r in shed:
        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
        assert error_of(r)["code"] == "rate_limit_exceeded", r.text
    assert all(n <= limit for n in waiting.values()), waiting  # no replica queues beyond its limit
    # At most max_ongoing_requests (8) on each of 3 replicas: 30 chats cannot all be held.
    assert len(shed) >= num_chats - 3 * engine["max_ongoing_requests"]
    assert all(n >= limit for n in held.values()), (held, waiting)  # shed only once every replica took its share
    idle = wait_until_idle(served)
    assert all(not v["active_request_ids"] for v in idle.values())


async def _chats_against_full_replicas(
    served: ServeHandle, num_chats: int
) -> tuple[list[httpx.Response], dict[str, dict]]:
    """Send the chats at once; once each is either answered or held by a replica (or SETTLE_S passed), return the
    answers and the replicas' admin views. The held chats are then abandoned (the engines abort them)."""
    url = f"{served.base_url}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=120) as client:
        tasks = [
            asyncio.create_task(client.post(url, json=chat_body(served.model, i, max_tokens=4, stream=False)))
            for i in range(num_chats)
        ]
        try:
            deadline = time.monotonic() + SETTLE_S
            while True:
                views = await asyncio.to_thread(lambda: {r: served.replica(r) for r in engine_replicas()})
                num_held = sum(len(v["active_request_ids"]) for v in views.values())
                if num_held + sum(t.done() for t in tasks) >= num_chats or time.monotonic() > deadline:
                    return [t.result() for t in tasks if t.done()], views
                await asyncio.sleep(0.2)
        finally:
            for t in tasks:
                t.cancel()  # the client goes away: the engines abort what they hold
            await asyncio.gather(*tasks, return_exceptions=True)


# -- graceful drain --------------------------------------------------------------------------------
class _Seen:
    """What the test saw of a stream: its replica (`X-Replica`) at the first event, or the refusal before it."""

    def __init__(self) -> None:
        self.replica = ""
        self.refused: Outcome | None = None
        self.done = asyncio.Event()


async def _read_stream(client: httpx.AsyncClient, url: str, body: dict, watch: _Seen) -> list[str]:
    """A stream's `data:` payloads as far as it went (the replica noted on `watch` at the first event); a request
    refused before its stream started is noted on `watch.refused`."""
    payloads: list[str] = []
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                watch.refused = classify_response(r.status_code, await r.aread())
                return payloads
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    payloads.append(line[6:])
                    if not watch.done.is_set():
                        watch.replica = r.headers.get("x-replica", "")
                        watch.done.set()
    except httpx.HTTPError:
        pass  # cut: judged by what arrived
    finally:
        watch.done.set()
    return payloads


def _completion_tokens(payloads: list[str]) -> int | None:
    usage = [json.loads(p)["usage"] for p in payloads if p != "[DONE]" and json.loads(p).get("usage")]
    return usage[-1]["completion_tokens"] if usage else None


def _stream_body(served: ServeHandle, i: int, max_tokens: int, doc_tokens: int = 0) -> dict:
    body = chat_body(served.model, i, max_tokens=max_tokens, stream=True, doc_tokens=doc_tokens)
    body["stream_options"] = {"include_usage": True}
    return body


def _stream_bodies(served: ServeHandle, num_chats: int, max_tokens: int) -> list[dict]:
    """Chats for both chat replicas and two documents for the long lane: every replica holds a stream."""
    bodies = [_stream_body(served, i, max_tokens) for i in range(num_chats)]
    return bodies + [_stream_body(served, 100 + i, max_tokens, doc_tokens=3000) for i in range(2)]


MAX_EXTRA_STREAMS = 6
"""Chats added until every engine replica holds a started stream (the router places by load, not round robin)."""


def wait_engines_ready(served: ServeHandle, timeout_s: float = SETTLE_S) -> None:
    """Until every engine replica's engine is ready and has published so for a routing stats period or two (a
    replica redeployed by the previous test gets nothing from the routers before)."""
    deadline = time.monotonic() + timeout_s
    while not all(served.replica(rid)["load"]["ready"] for rid in engine_replicas()):
        assert time.monotonic() < deadline, "engine replicas not ready"
        time.sleep(0.25)
    time.sleep(1.0)


async def _streams_across_a_scale_down(served: ServeHandle, bodies: list[dict], cfg: dict, max_tokens: int):
    """Start the streams (and more chats of `max_tokens` until every engine replica holds one: whichever Serve stops
    has streams to drain); once each has its first event, deploy `cfg` (fewer engine replicas) and send chats while
    Serve stops a replica. Returns each stream's (replica, payloads), the replica stopped and the chats' outcomes."""
    url = f"{served.base_url}/v1/chat/completions"
    wait_engines_ready(served)
    before = set(engine_replicas())
    watches: list[_Seen] = []
    streams: list[asyncio.Task[list[str]]] = []
    async with httpx.AsyncClient(timeout=180) as client:

        async def open_streams(more: list[dict]) -> None:
            new = [_Seen() for _ in more]
            watches.extend(new)
            streams.extend(asyncio.create_task(_read_stream(client, url, b, w)) for b, w in zip(more, new, strict=True))
            await asyncio.wait_for(asyncio.gather(*(w.done.wait() for w in new)), SETTLE_S)

        await open_streams(bodies)
        for extra in range(MAX_EXTRA_STREAMS):
            if before <= {w.replica for w in watches if w.refused is None}:
                break
            await open_streams([_stream_body(served, 200 + extra, max_tokens)])
        assert before <= {w.replica for w in watches if w.refused is None}, "a replica holds no stream to drain"
        deploying = asyncio.create_task(asyncio.to_thread(served.deploy, cfg))
        during = []
        while not all(s.done() for s in streams):  # new requests while the replica drains
            body = chat_body(served.model, 1000 + len(during), max_tokens=4, stream=False)
            during.append(await send(client, url, body, f"during-{len(during)}"))
            await asyncio.sleep(0.5)
        payloads = await asyncio.gather(*streams)
        await deploying
    deadline = time.monotonic() + SETTLE_S
    while len(engine_replicas()) >= len(before) and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
    stopped = before - set(engine_replicas())
    assert len(stopped) == 1, (before, engine_replicas())
    # On 2 busy CPUs Serve's own queue in the handle may shed a stream before it starts: a 429 with a body.
    refused = [w.refused for w in watches if w.refused is not None]
    assert all(o.kind == SHED for o in refused), refused
    started = [(w.replica, p) for w, p in zip(watches, payloads, strict=True) if w.refused is None]
    return started, stopped.pop(), during


def test_a_replica_stopped_by_serve_finishes_its_streams_within_the_drain_timeout(served: ServeHandle) -> None:
    """Scale the engines 3 -> 2: Serve drains the replica it stops (graceful_shutdown_timeout_s 20 s); its streams
    (~5 s each) end with [DONE] and every token asked for; chats sent meanwhile go to the others."""
    max_tokens = 300
    cfg = copy.deepcopy(served.config)
    deployment(cfg, "Engine")["num_replicas"] = 2
    original = served.config
    try:
        streams, stopped, during = asyncio.run(
            _streams_across_a_scale_down(served, _stream_bodies(served, 4, max_tokens), cfg, max_tokens)
        )
    finally:
        served.deploy(original)
    assert any(replica == stopped for replica, _ in streams)  # the drain had streams to finish
    for replica, payloads in streams:
        assert classify_stream(payloads).kind == ANSWERED, (replica, payloads[-3:])
        assert payloads[-1] == "[DONE]" and _completion_tokens(payloads) == max_tokens, (replica, payloads[-3:])
    assert during and all(o.kind in {ANSWERED, SHED} for o in during), during


def test_streams_past_the_drain_timeout_end_with_an_error_event_and_done(served: ServeHandle) -> None:
    """With a 2 s drain, streams of ~25 s on the replica Serve stops are cut by its kill: each ends with an
    OpenAI error event and [DONE] (never a silently cut stream); the other replicas' streams finish."""
    max_tokens = 2000
    original = served.config
    short_drain = copy.deepcopy(original)
    deployment(short_drain, "Engine")["graceful_shutdown_timeout_s"] = 2
    scaled_down = copy.deepcopy(short_drain)
    deployment(scaled_down, "Engine")["num_replicas"] = 2
    try:
        served.deploy(short_drain)
        streams, stopped, during = asyncio.run(
            _streams_across_a_scale_down(served, _stream_bodies(served, 4, max_tokens), scaled_down, max_tokens)
        )
    finally:
        served.deploy(original)
    on_stopped = [p for replica, p in streams if replica == stopped]
    assert on_stopped  # the kill had streams to cut
    for payloads in on_stopped:
        assert classify_stream(payloads) == Outcome(FAILED, "stream:engine_replica_lost"), payloads[-3:]
        assert payloads[-1] == "[DONE]"
    for replica, payloads in streams:
        if replica != stopped:
            assert _completion_tokens(payloads) == max_tokens and payloads[-1] == "[DONE]", (replica, payloads[-3:])
    assert during and all(o.kind in {ANSWERED, SHED} for o in during), during


# -- faults ----------------------------------------------------------------------------------------
def test_disconnect_storm_leaves_no_engine_request_behind(served: ServeHandle) -> None:
    async def storm() -> list:
        url = f"{served.base_url}/v1/chat/completions"
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(
                *(
                    send_and_leave(client, url, chat_body(served.model, i, max_tokens=3000, stream=True), f"gone-{i}")
                    for i in range(12)
                )
            )

    results = asyncio.run(storm())
    kinds = Counter(o.kind for o, _ in results)
    assert set(kinds) <= {CANCELLED, SHED} and kinds[CANCELLED] >= 1
    views = wait_until_idle(served)
    for rid, v in views.items():
        assert not v["active_request_ids"], rid
        assert v["kv_used_tokens"] == 0 and v["load"]["num_waiting"] == 0, rid
    assert post(served, ok_body(served)).status_code == 200


def test_replica_killed_under_streams_fails_only_its_requests(served: ServeHandle) -> None:
    """Streams on the killed replica end with an error event and [DONE]; the others finish; Serve replaces it."""
    num_streams = 8

    async def scenario():
        url = f"{served.base_url}/v1/chat/completions"
        watches = [StreamWatch() for _ in range(num_streams)]
        async with httpx.AsyncClient(timeout=120) as client:
            streams = [
                asyncio.create_task(
                    send(client, url, chat_body(served.model, i, max_tokens=400, stream=True), f"kill-{i}", w)
                )
                for i, w in enumerate(watches)
            ]
            await asyncio.wait_for(asyncio.gather(*(w.done.wait() for w in watches)), SETTLE_S)
            on = Counter(w.replica for w in watches if w.replica)
            victim = on.most_common(1)[0][0]
            await asyncio.to_thread(kill_replica, victim)
            outcomes = await asyncio.gather(*streams)
        return victim, watches, outcomes

    victim, watches, outcomes = asyncio.run(scenario())
    for w, o in zip(watches, outcomes, strict=True):
        if w.replica == victim:
            # Cut only by the kill: an explicit error (never a stream without [DONE]) or, if it won the race, done.
            assert o.kind == ANSWERED or (o.kind == FAILED and o.detail == "stream:engine_replica_lost"), o
        elif w.replica:
            assert o.kind == ANSWERED, o  # the other replicas' streams are untouched
        else:
            assert o.kind == SHED, o  # never started: shed at the door, with a status and a body

    # Serve replaces the replica; new requests are answered meanwhile (re-routed) or shed with a body.
    deadline = time.monotonic() + 60
    while victim in engine_replicas() or len(engine_replicas()) < 3:
        assert time.monotonic() < deadline, "Serve did not replace the killed replica"
        r = post(served, ok_body(served))
        assert classify_response(r.status_code, r.content).kind in {ANSWERED, SHED}
        time.sleep(0.5)
    assert post(served, ok_body(served)).status_code == 200
