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
    StreamWatch,
    chat_body,
    classify_response,
    engine_replicas,
    kill_replica,
    send,
    send_and_leave,
)
from tests.serve.conftest import ServeHandle, deployment

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


def doc(num_tokens: int) -> str:
    return ("lorem ipsum dolor sit amet " * (num_tokens * 4 // 27 + 1))[: num_tokens * 4]


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
    served.deploy(cfg)
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
    body = {"model": served.model, "messages": [{"role": "user", "content": doc(doc_tokens)}], "max_tokens": 4}
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
