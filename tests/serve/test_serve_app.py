"""The Serve app end to end: real HTTP on 127.0.0.1, the real `openai` client, streaming and not.

One app for the module (see conftest): engine ranks 0 (long lane), 1 and 2 (chat lane), the sim
engine at 1/20 of real time, `busy_pending_requests=2`. Tests assert what holds however the 2 CPUs
schedule things (every request answered, lanes respected, decisions consistent with their reasons);
which replica a given load picks is the routing policy's, tested on synthetic stats in test_routing.
Each test starts from the module's config (a test that changed it and failed cannot leak the change).
"""

from __future__ import annotations

import copy
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from harness.net import listener
from loadtests.recording import server_timing
from tests.serve.conftest import ServeHandle, deployment

pytestmark = pytest.mark.serve


@pytest.fixture(autouse=True)
def baseline_config(served: ServeHandle):
    """Every test starts on the module's config, whatever the previous one left."""
    if served.config != served.baseline:
        served.deploy(copy.deepcopy(served.baseline))
    yield


SHORT = [{"role": "user", "content": "What is fair-share chunking?"}]
EMBEDDING_MODEL = "sim-embedding"


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
    assert [(m.id, m.kind) for m in models.data] == [(served.model, "chat"), (EMBEDDING_MODEL, "embedding")]
    r = httpx.get(f"{served.base_url}/health", timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_the_request_path_runs_at_the_raylets_priority_not_rays_niceness_15(served: ServeHandle) -> None:
    """Ray lowers each worker to niceness 15 as it starts unless its environment says otherwise; the config says 0
    (`serve_path.WORKER_PRIORITY_ENV`) for the replicas and for HAProxy, which the controller's actor starts."""
    port = int(served.base_url.rsplit(":", 1)[1])
    haproxy = listener(port)
    assert haproxy is not None and haproxy.name() == "haproxy"
    manager = haproxy.parent()
    raylet = manager.parent()
    assert "raylet" in raylet.name()  # this cluster's, whatever else runs on the machine
    workers = [(" ".join(w.cmdline()), w) for w in raylet.children()]
    replicas = [w for title, w in workers if "ServeReplica:fairshare:" in title]
    assert len(replicas) == 5  # the ingress, three engines, the embedder
    assert {p.nice() for p in (*replicas, manager, haproxy)} == {raylet.nice()}
    # A worker started without the setting, as Ray's idle pool starts them, lowers itself: the switch is what works.
    idle = [w for title, w in workers if title.startswith("ray::IDLE")]
    assert all(w.nice() == min(raylet.nice() + 15, 19) for w in idle)


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
    assert (headers["x-lane"], headers["x-traffic-class"]) == ("chat", "short")
    assert headers["x-replica"]
    # The router's decision (made in the ingress process) and the engine's first item, both from receipt.
    timings = server_timing(headers["server-timing"])
    assert set(timings) == {"route", "ttft"} and 0 <= timings["route"] <= timings["ttft"]


def test_user_field_is_the_session(served: ServeHandle) -> None:
    h1, _ = chat(served, SHORT, user="alice")
    h2, _ = chat(served, SHORT, user="alice")
    assert h1["x-session-id"] == h2["x-session-id"] == "alice"
    assert h1["x-replica"] == h2["x-replica"]
    assert h2["x-route"] == "affinity"


def test_a_followup_from_a_client_that_names_no_session_lands_where_its_document_is_cached(served: ServeHandle) -> None:
    document = [{"role": "user", "content": doc(6000, seed="plain-client")}]
    h1, r1 = chat(served, document, max_tokens=2)
    assert "x-session-id" not in h1 and h1["x-traffic-class"] == "long"
    # A plain OpenAI client re-sends the conversation: the document, the answer, then its question.
    answer = {"role": "assistant", "content": r1.choices[0].message.content}
    followup = [*document, answer, {"role": "user", "content": "And the second point?"}]
    h2, r2 = chat(served, followup, max_tokens=2)
    assert (h2["x-replica"], h2["x-route"], h2["x-traffic-class"]) == (h1["x-replica"], "affinity", "short")
    assert r2.usage.prompt_tokens_details.cached_tokens >= 5900  # the engine served the document from its cache


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
        # Over the context window with its output, well under the replica's queued-token limit (262,144): a 400
        # from the engine, not a 429, whatever earlier tests left queued.
        c.chat.completions.create(
            model=served.model, messages=[{"role": "user", "content": doc(200_000)}], max_tokens=70_000
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
    # Its own text: a refused request that began with the same text would count as cached on the replica it was
    # sent to until that replica's next publication (0.2 s here), making this document's first turn a chat there.
    document = [{"role": "user", "content": doc(12_000, seed="long-lane") + "\nSummarise."}]
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


def test_a_sessions_concurrent_requests_stay_or_give_way_within_the_chat_lane(served: ServeHandle) -> None:
    h0, _ = chat(served, SHORT, session="hot", max_tokens=2)
    pinned = h0["x-replica"]
    # Three requests of the session at once, each ~1000 uncached tokens: however they interleave, each stays
    # on the session's replica (affinity) or leaves it only because it was busy (gave-way), in the chat lane.
    prompts = [[{"role": "user", "content": doc(1000, seed=f"hot{i}")}] for i in range(3)]
    results = _concurrent(lambda m: chat(served, m, session="hot", max_tokens=2), prompts)
    for h, r in results:
        assert (h["x-lane"], h["x-traffic-class"]) == ("chat", "short")
        assert r.choices[0].finish_reason == "length"
        assert h["x-route"] in ("affinity", "gave-way")
        assert (h["x-route"] == "affinity") == (h["x-replica"] == pinned)


def _chat_or_shed(served: ServeHandle, messages, session: str, **kw):
    """A chat's headers and response, or the 429 it was shed with."""
    try:
        return chat(served, messages, session=session, **kw)
    except openai.RateLimitError as e:
        return e


def test_chats_under_load_are_all_answered_and_leave_the_chat_lane_only_as_a_spill(served: ServeHandle) -> None:
    prompts = [[{"role": "user", "content": doc(1500, seed=f"spill{i}")}] for i in range(5)]
    outcomes = _concurrent(
        lambda m: _chat_or_shed(served, m, session=f"spill-{m[0]['content'][:12]}", max_tokens=2), prompts
    )
    # Five at once against Serve's handle queue of 4 (conftest): on 2 busy CPUs the fifth may arrive while four
    # wait to be routed and be shed. Shed with a status and Retry-After is an answer; routing is judged on the rest.
    shed = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
    for e in shed:
        assert e.response.headers["retry-after"] and e.body["code"] == "rate_limit_exceeded"
    served_ = [o for o in outcomes if not isinstance(o, openai.RateLimitError)]
    assert len(served_) >= 4  # at most the one over Serve's queue is shed
    for h, r in served_:
        assert h["x-traffic-class"] == "short" and r.usage.completion_tokens == 2
        assert h["x-route"] == "spill" if h["x-lane"] == "long" else h["x-route"] in ("least-loaded", "affinity")


def test_live_reconfigure_changes_the_engines_without_restarting_them(served: ServeHandle) -> None:
    h, _ = chat(served, SHORT, session="reconf", max_tokens=1)
    before = served.replica(h["x-replica"])
    assert before["policy"]["max_running_requests"] == 10
    document = [{"role": "user", "content": doc(6000, seed="reconf")}]
    assert chat(served, document, session="reconf-doc-0", max_tokens=1)[0]["x-traffic-class"] == "long"

    cfg = copy.deepcopy(served.config)
    # One knob moves both the engines' planner and the routers' lanes: a 6000-token prompt becomes a chat.
    deployment(cfg, "Engine")["user_config"]["policy"] = {"max_running_requests": 1, "short_request_tokens": 8192}
    served.deploy(cfg)
    after = served.replica(h["x-replica"])
    assert after["policy"]["max_running_requests"] == 1
    assert after["policy"]["short_request_tokens"] == 8192
    assert after["load"]["max_running_requests"] == 1  # the engine's scheduler runs with it
    assert (after["pid"], after["started_at_s"]) == (before["pid"], before["started_at_s"])  # not restarted
    classes = _until(
        lambda i: chat(served, document, session=f"reconf-doc-{i + 1}", max_tokens=1)[0]["x-traffic-class"],
        lambda cls: cls == "short",
    )
    assert classes[-1] == "short"  # once the replicas published the new threshold (one stats period)


def _until(probe, done, timeout_s: float = 20.0) -> list:
    """Call `probe(i)` until `done(result)`; the results so far (routers learn published stats within a period)."""
    out = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out.append(probe(len(out)))
        if done(out[-1]):
            break
        time.sleep(0.2)
    return out


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
    # 3 replicas x max_ongoing_requests 8 + max_queued_requests 4 = 28 requests in the system at most; 40 requests
    # of ~5 s each (400 tokens at 1/20 of the card's ~4 tokens/s) are all sent well within that time.
    client = served.client

    def one(i: int):
        try:
            client.chat.completions.create(
                model=served.model, messages=SHORT, max_tokens=400, extra_headers={"X-Session-ID": f"flood-{i}"}
            )
            return 200, None
        except openai.RateLimitError as e:
            return 429, e

    results = _concurrent(one, list(range(40)))
    codes = [code for code, _ in results]
    assert set(codes) == {200, 429}  # every request answered: served, or shed with a clear status
    for err in (e for code, e in results if code == 429):
        assert err.response.headers["retry-after"] == "1"
        assert err.body["code"] == "rate_limit_exceeded"


def _lines(text: str, prefix: str, *fragments: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix) and all(f in line for f in fragments)]


WANTED = [
    ("ray_fairshare_ttft_seconds_count", 'lane="chat"'),
    ("ray_fairshare_ttft_seconds_count", 'lane="long"'),
    ("ray_fairshare_itl_seconds_bucket",),
    ("ray_fairshare_requests_total", 'endpoint="chat"', 'status="200"'),
    ("ray_fairshare_requests_total", 'endpoint="completions"', 'status="400"'),
    ("ray_fairshare_requests_total", 'endpoint="completions"', 'status="404"'),
    ("ray_fairshare_routing_decisions_total",),
    ("ray_fairshare_engine_waiting_requests",),
    ("ray_fairshare_engine_kv_used_tokens",),
]


def test_metrics_are_exported_to_prometheus(served: ServeHandle) -> None:
    chat(served, SHORT, session="metrics-chat", max_tokens=4)
    # Errors answered before any stream count too: a schema error (400) and an unknown model (404).
    assert httpx.post(f"{served.base_url}/v1/completions", json={"model": served.model}, timeout=10).status_code == 400
    nope = httpx.post(f"{served.base_url}/v1/completions", json={"model": "nope", "prompt": "x"}, timeout=10)
    assert nope.status_code == 404
    for _ in served.client.chat.completions.create(
        model=served.model,
        messages=[{"role": "user", "content": doc(6000, seed="metrics")}],
        max_tokens=4,
        stream=True,
        extra_headers={"X-Session-ID": "metrics-doc"},
    ):
        pass
    # Ray exports metrics every few seconds: poll its Prometheus endpoint until every series appears.
    deadline = time.monotonic() + 45
    missing = WANTED
    while missing and time.monotonic() < deadline:
        text = httpx.get(served.metrics_url, timeout=10).text
        missing = [w for w in WANTED if not _lines(text, *w)]
        if missing:
            time.sleep(1)
    assert missing == []


# -- the sim backend's documented subset, and embeddings -------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logprobs": True}, "logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"seed": 1, "presence_penalty": 0.5}, "presence_penalty"),
    ],
)
def test_sim_refuses_fields_it_does_not_implement_by_name(served: ServeHandle, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        chat(served, SHORT, extra_body=extra)
    assert e.value.body["param"] == param and e.value.body["code"] == "unsupported_field"
    assert all(name in e.value.message for name in extra)
    with pytest.raises(openai.BadRequestError) as e:
        chat(served, [{"role": "user", "content": "hi", "tool_call_id": "x"}])
    assert "tool_call_id" in e.value.message


def test_sim_embeddings_single_list_dimensions_and_base64(served: ServeHandle) -> None:
    import base64

    import numpy as np

    one = served.client.embeddings.create(model=EMBEDDING_MODEL, input="fair share")
    assert one.model == EMBEDDING_MODEL and len(one.data[0].embedding) == 256
    assert np.linalg.norm(one.data[0].embedding) == pytest.approx(1.0, abs=1e-5)
    many = served.client.embeddings.create(model=EMBEDDING_MODEL, input=["fair share", "chunking"])
    assert [d.index for d in many.data] == [0, 1]
    assert many.data[0].embedding == pytest.approx(one.data[0].embedding)  # deterministic: same input, same vector
    assert many.data[1].embedding != pytest.approx(one.data[0].embedding)
    short = served.client.embeddings.create(model=EMBEDDING_MODEL, input="fair share", dimensions=16)
    assert len(short.data[0].embedding) == 16
    assert np.linalg.norm(short.data[0].embedding) == pytest.approx(1.0, abs=1e-5)
    raw = httpx.post(
        f"{served.base_url}/v1/embeddings",
        json={"model": EMBEDDING_MODEL, "input": "fair share", "encoding_format": "base64"},
        timeout=30,
    ).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert decoded.tolist() == pytest.approx(one.data[0].embedding)
    assert many.usage.prompt_tokens == many.usage.total_tokens > 0


def test_embeddings_errors_name_the_problem(served: ServeHandle) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        served.client.embeddings.create(model=served.model, input="x")  # a chat model
    assert e.value.body["code"] == "wrong_model_kind"
    with pytest.raises(openai.NotFoundError):
        served.client.embeddings.create(model="no-such-model", input="x")
    with pytest.raises(openai.BadRequestError) as e:
        served.client.embeddings.create(model=EMBEDDING_MODEL, input="x", dimensions=4096)
    assert e.value.body["param"] == "dimensions"
    with pytest.raises(openai.BadRequestError) as e:
        served.client.embeddings.create(model=EMBEDDING_MODEL, input=[])
    assert e.value.body["param"] == "input"
    with pytest.raises(openai.BadRequestError) as e:
        served.client.embeddings.create(model=EMBEDDING_MODEL, input="x", extra_body={"truncate": True})
    assert e.value.body["param"] == "truncate"


def test_an_embeddings_burst_is_answered_or_shed_never_failed(served: ServeHandle) -> None:
    """More concurrent requests than the Embedder takes: each is a 200 or a 429 with Retry-After."""
    import asyncio

    async def burst(n: int) -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=n)
        async with httpx.AsyncClient(base_url=served.base_url, timeout=120, limits=limits) as client:
            body = {"model": EMBEDDING_MODEL, "input": "burst"}
            return await asyncio.gather(*(client.post("/v1/embeddings", json=body) for _ in range(n)))

    answers = asyncio.run(burst(400))
    statuses = [r.status_code for r in answers]
    assert set(statuses) <= {200, 429}, sorted(set(statuses))
    assert all(r.headers.get("retry-after") for r in answers if r.status_code == 429)
    assert statuses.count(200) >= 1
