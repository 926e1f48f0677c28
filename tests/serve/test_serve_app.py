"""The Serve app end to end: real HTTP on 127.0.0.1, the real `openai` client, streaming and not.

One app for the module (see conftest): engine ranks 0 (long lane), 1 and 2 (chat lane), the sim
engine at 1/20 of real time, `busy_pending_requests=2`.
"""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.serve.conftest import ServeHandle, deployment

pytestmark = pytest.mark.serve

SHORT = [{"role": "user", "content": "What is fair-share chunking?"}]


def doc(num_tokens: int, seed: str = "doc") -> str:
    """A document of about `num_tokens` tokens for the sim's 4-characters-per-token count."""
    unit = f"{seed} lorem ipsum dolor sit amet. "
    return (unit * (num_tokens * 4 // len(unit) + 1))[: num_tokens * 4]


def chat(served: ServeHandle, messages, session: str | None = None, **kw):
    headers = {"X-Session-ID": session} if session else {}
    raw = served.client.chat.completions.with_raw_response.create(
        model=served.model, messages=messages, extra_headers=headers, **{"max_tokens": 8, **kw}
    )
    return raw.headers, raw.parse()


def test_models_and_health(served: ServeHandle) -> None:
    models = served.client.models.list()
    assert [m.id for m in models.data] == [served.model]
    r = httpx.get(f"{served.base_url}/health", timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_chat_completion_with_usage_and_routing_headers(served: ServeHandle) -> None:
    headers, resp = chat(served, SHORT, session="hdr-1", max_tokens=5)
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content.split() == ["the", "quick", "answer", "is", "that"]
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 5
    assert resp.usage.prompt_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 5
    assert headers["x-session-id"] == "hdr-1"
    assert headers["x-lane"] == "chat"
    assert headers["x-replica"]


def test_user_field_is_the_session(served: ServeHandle) -> None:
    h1, _ = chat(served, SHORT, user="alice")
    h2, _ = chat(served, SHORT, user="alice")
    assert h1["x-session-id"] == h2["x-session-id"] == "alice"
    assert h1["x-replica"] == h2["x-replica"]
    assert h2["x-route"] == "affinity"


def test_chat_stream_with_include_usage(served: ServeHandle) -> None:
    with served.client.chat.completions.with_streaming_response.create(
        model=served.model,
        messages=SHORT,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Session-ID": "stream-1"},
    ) as raw:
        assert raw.headers["x-lane"] == "chat"
        assert raw.headers["x-session-id"] == "stream-1"
        chunks = list(raw.parse())
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content.split() == ["the", "quick", "answer", "is", "that", "shorter"]
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_completions_stream_and_stop(served: ServeHandle) -> None:
    stream = served.client.completions.create(
        model=served.model, prompt="Say something.", max_tokens=50, stop=["answer"], stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks)
    assert text == "the quick "
    assert chunks[-1].choices[0].finish_reason == "stop"
    plain = served.client.completions.create(model=served.model, prompt="Say something.", max_tokens=3)
    assert plain.object == "text_completion" and plain.choices[0].text.split() == ["the", "quick", "answer"]
    assert plain.usage.completion_tokens == 3


def test_errors_are_openai_bodies(served: ServeHandle) -> None:
    c = served.client
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-4o", messages=SHORT)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=served.model, messages=SHORT, n=2)
    assert "n=1" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=served.model, messages=SHORT, temperature=3.5)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(
            model=served.model, messages=[{"role": "user", "content": doc(262_000)}], max_tokens=500
        )
    assert e.value.body["code"] == "context_length_exceeded"
    for method, path, body in [
        ("GET", "/v1/nothing", None),
        ("POST", "/v1/chat/completions", b"{not json"),
        ("POST", "/v1/chat/completions", b'{"model": "x"}'),
    ]:
        r = httpx.request(method, served.base_url + path, content=body, timeout=10)
        assert r.status_code in (400, 404, 422)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
        assert "Traceback" not in r.text


def test_long_document_takes_the_long_lane_and_its_followup_stays(served: ServeHandle) -> None:
    document = [{"role": "user", "content": doc(12_000) + "\nSummarise."}]
    h1, r1 = chat(served, document, session="doc-1", max_tokens=4)
    assert (h1["x-lane"], h1["x-traffic-class"]) == ("long", "long")
    assert r1.usage.prompt_tokens >= 12_000
    # The follow-up carries the whole transcript; only the new question is uncached where the doc is.
    followup = [*document, {"role": "assistant", "content": r1.choices[0].message.content}]
    followup.append({"role": "user", "content": "And the second point?"})
    h2, r2 = chat(served, followup, session="doc-1", max_tokens=4)
    assert h2["x-replica"] == h1["x-replica"]
    assert (h2["x-lane"], h2["x-traffic-class"], h2["x-route"]) == ("long", "short", "affinity")
    assert r2.usage.prompt_tokens_details.cached_tokens >= 11_900


def test_short_chat_takes_the_chat_lane_and_keeps_its_replica(served: ServeHandle) -> None:
    messages = list(SHORT)
    replicas, routes = [], []
    for turn in range(3):
        h, r = chat(served, messages, session="chat-keep", max_tokens=4)
        assert (h["x-lane"], h["x-traffic-class"]) == ("chat", "short")
        replicas.append(h["x-replica"])
        routes.append(h["x-route"])
        messages = [*messages, {"role": "assistant", "content": r.choices[0].message.content}]
        messages.append({"role": "user", "content": f"Tell me more ({turn})."})
    assert len(set(replicas)) == 1
    assert routes[1:] == ["affinity", "affinity"]


def _concurrent(fn, args_list):
    with ThreadPoolExecutor(len(args_list)) as pool:
        return list(pool.map(fn, args_list))


def test_hot_replica_gives_way(served: ServeHandle) -> None:
    h0, _ = chat(served, SHORT, session="hot", max_tokens=2)
    pinned = h0["x-replica"]
    # Three requests of the session at once, each ~1000 uncached tokens: the pinned replica takes two
    # (busy_pending_requests=2), the third goes to the other chat replica.
    prompts = [[{"role": "user", "content": doc(1000, seed=f"hot{i}")}] for i in range(3)]
    results = _concurrent(lambda m: chat(served, m, session="hot", max_tokens=2)[0], prompts)
    routes = sorted((h["x-route"], h["x-replica"] == pinned, h["x-lane"]) for h in results)
    assert routes == [("affinity", True, "chat"), ("affinity", True, "chat"), ("gave-way", False, "chat")]


def test_chat_spills_to_the_long_lane_when_the_chat_lane_is_saturated(served: ServeHandle) -> None:
    prompts = [[{"role": "user", "content": doc(1500, seed=f"spill{i}")}] for i in range(5)]
    results = _concurrent(
        lambda m: chat(served, m, session=f"spill-{m[0]['content'][:8]}-{id(m)}", max_tokens=2)[0], prompts
    )
    lanes = sorted((h["x-lane"], h["x-route"], h["x-traffic-class"]) for h in results)
    assert lanes.count(("chat", "least-loaded", "short")) == 4
    assert lanes.count(("long", "spill", "short")) == 1


def _stream_times(served: ServeHandle, session: str, max_tokens: int, out: dict, key: str, start: threading.Event):
    start.wait()
    t0 = time.monotonic()
    stream = served.client.chat.completions.create(
        model=served.model, messages=SHORT, max_tokens=max_tokens, stream=True, extra_headers={"X-Session-ID": session}
    )
    times = [time.monotonic() - t0 for c in stream if c.choices and c.choices[0].delta.content]
    out[key] = (t0, times)


def _second_waits_for_first(served: ServeHandle, session: str) -> bool:
    """Two concurrent streams of one session (same replica): does the second start only after the first ends?"""
    out: dict = {}
    go_a, go_b = threading.Event(), threading.Event()
    a = threading.Thread(target=_stream_times, args=(served, session, 40, out, "a", go_a))
    b = threading.Thread(target=_stream_times, args=(served, session, 3, out, "b", go_b))
    a.start()
    b.start()
    go_a.set()
    time.sleep(0.1)
    go_b.set()
    a.join(60)
    b.join(60)
    (ta, times_a), (tb, times_b) = out["a"], out["b"]
    end_a = ta + times_a[-1]
    first_b = tb + times_b[0]
    return first_b >= end_a - 0.02


def test_live_reconfigure_changes_engine_behaviour(served: ServeHandle) -> None:
    h, _ = chat(served, SHORT, session="reconf", max_tokens=1)
    before = served.replica(h["x-replica"])
    assert before["policy"]["max_running_requests"] == 10
    assert not _second_waits_for_first(served, "reconf")

    original = copy.deepcopy(served.config)
    cfg = copy.deepcopy(served.config)
    deployment(cfg, "Engine")["user_config"]["policy"] = {"max_running_requests": 1}
    deployment(cfg, "Ingress")["user_config"]["busy_pending_requests"] = 100  # keep both on the pinned replica
    served.deploy(cfg)
    try:
        after = served.replica(h["x-replica"])
        assert after["policy"]["max_running_requests"] == 1
        assert (after["pid"], after["started_at_s"]) == (before["pid"], before["started_at_s"])  # not restarted
        assert _second_waits_for_first(served, "reconf")
    finally:
        served.deploy(original)
    assert served.replica(h["x-replica"])["policy"]["max_running_requests"] == 10


def test_disconnect_mid_stream_frees_queue_and_kv(served: ServeHandle) -> None:
    client = httpx.Client(timeout=30)
    body = {"model": served.model, "messages": SHORT, "max_tokens": 3000, "stream": True}
    with client.stream(
        "POST", f"{served.base_url}/v1/chat/completions", json=body, headers={"X-Session-ID": "gone"}
    ) as r:
        replica = r.headers["x-replica"]
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        rid = next(line for line in got if line.startswith("data: {")).split('"id":"')[1].split('"')[0]
        during = served.replica(replica)
        assert rid in during["active_request_ids"]
        assert during["kv_used_tokens"] > 0
    client.close()  # the client goes away mid-stream (3000 tokens would take ~40 s)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        info = served.replica(replica)
        if rid not in info["active_request_ids"]:
            break
        time.sleep(0.2)
    assert rid not in info["active_request_ids"]
    assert info["kv_used_tokens"] == 0
    assert info["load"]["num_waiting"] == 0 and info["load"]["num_decoding"] == 0
    assert info["counters"]["aborted"] >= during["counters"]["aborted"] + 1


def test_overload_answers_429_with_retry_after(served: ServeHandle) -> None:
    # 3 replicas x max_ongoing_requests 8 + max_queued_requests 4 = 28 requests in the system at most.
    def one(i: int):
        try:
            served.client.chat.completions.create(
                model=served.model, messages=SHORT, max_tokens=40, extra_headers={"X-Session-ID": f"flood-{i}"}
            )
            return 200, None
        except openai.RateLimitError as e:
            return 429, e

    results = _concurrent(one, list(range(40)))
    shed = [e for code, e in results if code == 429]
    assert shed, "expected some requests to be shed"
    assert sum(code == 200 for code, _ in results) >= 24
    err = shed[0]
    assert err.response.headers["retry-after"] == "1"
    assert err.body["code"] == "rate_limit_exceeded"


def _scrape_until(url: str, wanted: list[str], timeout_s: float = 45.0) -> str:
    """Ray exports metrics every few seconds: poll its Prometheus endpoint until every line prefix appears."""
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = httpx.get(url, timeout=10).text
        if all(any(line.startswith(w) for line in text.splitlines()) for w in wanted):
            break
        time.sleep(1)
    return text


def test_metrics_are_exported_to_prometheus(served: ServeHandle) -> None:
    chat(served, SHORT, session="metrics-chat", max_tokens=4)
    for _ in served.client.chat.completions.create(
        model=served.model,
        messages=[{"role": "user", "content": doc(6000, seed="metrics")}],
        max_tokens=4,
        stream=True,
        extra_headers={"X-Session-ID": "metrics-doc"},
    ):
        pass
    wanted = [
        "ray_fairshare_ttft_seconds_bucket",
        "ray_fairshare_itl_seconds_bucket",
        "ray_fairshare_requests_total",
        "ray_fairshare_routing_decisions_total",
        "ray_fairshare_engine_waiting_requests",
        "ray_fairshare_engine_kv_used_tokens",
    ]
    text = _scrape_until(served.metrics_url, wanted)
    missing = [w for w in wanted if not any(line.startswith(w) for line in text.splitlines())]
    assert missing == []
    ttft_lanes = {
        m
        for line in text.splitlines()
        if line.startswith("ray_fairshare_ttft_seconds_count")
        for m in ("chat", "long")
        if f'lane="{m}"' in line
    }
    assert ttft_lanes == {"chat", "long"}
