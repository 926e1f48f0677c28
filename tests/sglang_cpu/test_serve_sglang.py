"""The Serve app with `backend: sglang` on real sglang (CPU, tiny model), driven with the `openai` client.

One app for the module, deployed from `config.sglang-cpu.yaml` as `serve run` deploys it: two engine
replicas (rank 0 the long lane, rank 1 the chat lane) and one embeddings engine, so three engine starts in
all, plus two restarts in the last test (the policy change). Each test reads only the app's answers and
the replicas' admin views, so one failing test leaves the app as it was for the next. The tiny model's
weights are random: tests assert shapes, protocol and decisions (what sglang's serving classes and our
routing did), never what the text says.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import yaml

from harness.cpu_env import REPO_ROOT, STANDIN_DIR
from harness.local_serve import deploy, deployment, start_on_a_free_port
from harness.net import free_port
from harness.sglang_traffic import wait_for
from serve_app.config.serve_path import CONTROLLER_OPTIONS
from tests.sglang_cpu.fixtures import TINY_MODEL

pytestmark = [pytest.mark.sglang_cpu, pytest.mark.serve, pytest.mark.timeout(1500)]  # the first test starts 3 engines

CONFIG_FILE = REPO_ROOT / "config.sglang-cpu.yaml"
DEPLOY_TIMEOUT_S = 1200  # three engines; measured up to 660 s on the shared 2-core machine under load
KV_POOL_TOKENS = 3072
"""Smaller than the context window: a longer prompt passes sglang's tokenizer and is aborted by its scheduler."""
CHAT_MODEL, EMBEDDING_MODEL = "tiny-llama", "tiny-llama-embedding"


def words(n: int, start: int = 10) -> str:
    """`n` words (one to three tokens each for the tiny model's byte-level tokenizer)."""
    return " ".join(f"w{start + i % 900}" for i in range(n))


def app_config(port: int, model_dir: Path) -> dict[str, Any]:
    cfg = yaml.safe_load(CONFIG_FILE.read_text())
    cfg["http_options"] = {"host": "127.0.0.1", "port": port}
    app = cfg["applications"][0]
    env = app["runtime_env"]["env_vars"]
    # The stand-in on every replica's path (test infrastructure: never in the package).
    env["PYTHONPATH"] = os.pathsep.join([str(STANDIN_DIR), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    app["args"]["sglang"]["model_path"] = str(model_dir)
    app["args"]["sglang"]["engine_args"]["max_total_tokens"] = KV_POOL_TOKENS
    app["args"]["embeddings"]["model_path"] = str(model_dir)
    return cfg


class App:
    def __init__(self, base_url: str, config: dict[str, Any], metrics_url: str) -> None:
        self.base_url = base_url
        self.config = config
        self.metrics_url = metrics_url
        """Ray's Prometheus endpoint on this node (the app's metrics appear there, prefixed `ray_`)."""
        self.client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)

    def replica(self, replica_id: str) -> dict[str, Any]:
        r = httpx.get(f"{self.base_url}/admin/replicas/{replica_id}", timeout=60)
        r.raise_for_status()
        return r.json()

    def chat(self, messages: list[dict[str, Any]], session: str | None = None, **kw: Any):
        headers = {"X-Session-ID": session} if session else {}
        raw = self.client.chat.completions.with_raw_response.create(
            model=CHAT_MODEL, messages=messages, extra_headers=headers, **{"max_tokens": 4, **kw}
        )
        return raw.headers, raw.parse()


@pytest.fixture(scope="module")
def app(tiny_bytes_model_dir: Path) -> Iterator[App]:
    import ray
    from ray import serve

    metrics_port = free_port()
    # The controller as the config file sets it; the proxy on a port found free just before it binds.
    port = start_on_a_free_port(metrics_port=metrics_port, namespace="sglang-serve")
    cfg = app_config(port, tiny_bytes_model_dir)
    try:
        assert cfg["proxy_location"] == "HeadOnly" and cfg["controller_options"] == CONTROLLER_OPTIONS
        deploy(cfg, timeout_s=DEPLOY_TIMEOUT_S, poll_s=1)
        yield App(f"http://127.0.0.1:{port}", cfg, f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        serve.shutdown()
        ray.shutdown()


USER = [{"role": "user", "content": "w1 w2 w3"}]


def test_models_lists_each_model_with_its_kind(app: App) -> None:
    data = httpx.get(f"{app.base_url}/v1/models", timeout=30).json()["data"]
    assert {(m["id"], m["kind"]) for m in data} == {(CHAT_MODEL, "chat"), (EMBEDDING_MODEL, "embedding")}


def test_chat_and_completions_with_usage(app: App) -> None:
    headers, resp = app.chat(USER, max_tokens=3, session="plain-1")
    assert resp.object == "chat.completion" and len(resp.choices) == 1
    assert resp.usage.completion_tokens <= 3 and resp.usage.prompt_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert headers["x-session-id"] == "plain-1" and headers["x-replica"]
    comp = app.client.completions.create(model=CHAT_MODEL, prompt="w5 w6", max_tokens=3)
    assert comp.object == "text_completion" and comp.usage.prompt_tokens > 0


def test_streaming_chat_with_usage(app: App) -> None:
    chunks = list(
        app.client.chat.completions.create(
            model=CHAT_MODEL, messages=USER, max_tokens=3, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 3
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    streamed = list(app.client.completions.create(model=CHAT_MODEL, prompt="w5 w6", max_tokens=3, stream=True))
    assert streamed and streamed[-1].choices[0].finish_reason in {"stop", "length"}


def test_relayed_streams_record_ttft_and_itl_as_the_sim_backend_does(app: App) -> None:
    # sglang's field: every stream has all its tokens (the weights are random). The chats run for longer than the
    # replica's stream spacing, so their tokens come in several items and the ingress records gaps between them.
    run_on = {"ignore_eos": True}
    for session in ("metrics-1", "metrics-2"):
        headers = {"X-Session-ID": session}
        chat = app.client.chat.completions.create(
            model=CHAT_MODEL, messages=USER, max_tokens=64, stream=True, extra_headers=headers, extra_body=run_on
        )
        assert sum(bool(c.choices and c.choices[0].delta.content) for c in chat) >= 1
    completion = app.client.completions.create(
        model=CHAT_MODEL, prompt="w5 w6", max_tokens=8, stream=True, extra_body=run_on
    )
    assert sum(bool(c.choices and c.choices[0].text) for c in completion) >= 1
    wanted = [
        ("ray_fairshare_ttft_seconds_count", 'traffic_class="short"'),
        ("ray_fairshare_itl_seconds_count", 'traffic_class="short"'),
        ("ray_fairshare_requests_total", 'endpoint="chat"', 'status="200"'),
        ("ray_fairshare_requests_total", 'endpoint="completions"', 'status="200"'),
    ]
    # Ray exports metrics every few seconds: poll its Prometheus endpoint until every series appears.
    deadline, missing = time.monotonic() + 60, wanted
    while missing and time.monotonic() < deadline:
        text = httpx.get(app.metrics_url, timeout=10).text
        lines = text.splitlines()
        missing = [
            w for w in wanted if not any(line.startswith(w[0]) and all(f in line for f in w[1:]) for line in lines)
        ]
        if missing:
            time.sleep(1)
    assert missing == []


def test_logprobs_with_top_logprobs_and_two_choices(app: App) -> None:
    _, resp = app.chat(USER, max_tokens=3, logprobs=True, top_logprobs=2, n=2)
    assert sorted(c.index for c in resp.choices) == [0, 1]
    for choice in resp.choices:
        tokens = choice.logprobs.content
        assert tokens and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in tokens)


def test_completions_list_prompt_with_echo(app: App) -> None:
    resp = app.client.completions.create(model=CHAT_MODEL, prompt=["w5 w6", "w7"], echo=True, max_tokens=2, logprobs=1)
    by_index = {c.index: c for c in resp.choices}
    assert sorted(by_index) == [0, 1]
    assert by_index[0].text.startswith("w5 w6") and by_index[1].text.startswith("w7")
    assert by_index[0].logprobs is not None


SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["small", "large"]}},
    "required": ["ok", "size"],
    "additionalProperties": False,
}


def test_response_format_json_schema_output_parses_and_matches(app: App) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    _, resp = app.chat(USER, max_tokens=100, response_format=fmt)
    jsonschema.validate(json.loads(resp.choices[0].message.content), SCHEMA)


def test_tools_with_tool_choice_required_are_constrained_calls(app: App) -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": SCHEMA}}]
    # The grammar allows any number of calls; a random model closes the list after each with ~1/2 chance, so
    # 600 tokens (~15 calls) leave a truncated list a ~1e-5 event.
    _, resp = app.chat(USER, max_tokens=600, tools=tools, tool_choice="required")
    message = resp.choices[0].message
    calls = message.tool_calls or []
    if calls:  # sglang filled tool_calls: each names our tool with arguments matching its schema
        for call in calls:
            assert call.function.name == "lookup"
            jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    else:  # no parser for the tiny model's format: the grammar still forced a call list of our tool
        for call in json.loads(message.content):
            assert call["name"] == "lookup"
            jsonschema.validate(call["parameters"], SCHEMA)


def test_embeddings_single_list_and_dimensions(app: App) -> None:
    one = app.client.embeddings.create(model=EMBEDDING_MODEL, input="w1 w2")
    assert len(one.data) == 1 and len(one.data[0].embedding) > 0
    many = app.client.embeddings.create(model=EMBEDDING_MODEL, input=["w1 w2", "w3", "w4 w5 w6"])
    assert [d.index for d in many.data] == [0, 1, 2]
    assert {len(d.embedding) for d in many.data} == {len(one.data[0].embedding)}
    assert many.data[0].embedding == pytest.approx(one.data[0].embedding, abs=1e-3)  # same input, same vector
    assert many.usage.prompt_tokens >= 3
    assert len(one.data[0].embedding) == TINY_MODEL.hidden_size  # the model's own dimension
    with pytest.raises(openai.BadRequestError) as e:  # sglang's answer for a model without matryoshka dimensions
        app.client.embeddings.create(model=EMBEDDING_MODEL, input="w1", dimensions=8)
    assert "dimensions" in e.value.message


def test_wrong_model_kind_and_unknown_field_are_400s(app: App) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        app.client.embeddings.create(model=CHAT_MODEL, input="w1")
    assert e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        app.chat(USER, extra_body={"not_an_openai_field": 1})
    assert "not_an_openai_field" in e.value.message and e.value.body["param"] == "not_an_openai_field"


def test_sglang_error_reaches_the_client_with_its_status_and_message(app: App) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        app.chat([], max_tokens=2)  # sglang's own validation: no messages
    assert e.value.status_code == 400


def test_sglang_abort_surfaces_as_an_openai_error(app: App) -> None:
    # Within the context window (the tokenizer lets it through) but over the KV pool: sglang's scheduler
    # aborts the request (finish_reason abort with a status); the client gets that status and message.
    prompt = [5] * (KV_POOL_TOKENS + 300)  # token ids: exactly this many tokens
    with pytest.raises(openai.APIStatusError) as e:
        app.client.completions.create(model=CHAT_MODEL, prompt=prompt, max_tokens=2)
    assert 400 <= e.value.status_code < 600
    assert e.value.body and e.value.body.get("message")
    r = httpx.post(
        f"{app.base_url}/v1/completions",
        json={"model": CHAT_MODEL, "prompt": prompt, "max_tokens": 2, "stream": True},
        timeout=120,
    )
    events = [line.removeprefix("data: ") for line in r.text.splitlines() if line.startswith("data: ")]
    if r.status_code == 200:  # aborted after the stream opened: an error event, then the stream ends properly
        assert any("error" in json.loads(ev) for ev in events if ev != "[DONE]")
        assert events[-1] == "[DONE]"
    else:
        assert 400 <= r.status_code < 600 and r.json()["error"]["message"]


def test_lanes_and_session_affinity(app: App) -> None:
    short = [app.chat(USER, session="aff-short") for _ in range(2)]
    long_headers, _ = app.chat([{"role": "user", "content": words(400)}], session="aff-long")
    (h1, _), (h2, _) = short
    assert (h1["x-lane"], h1["x-traffic-class"]) == ("chat", "short")
    assert (long_headers["x-lane"], long_headers["x-traffic-class"]) == ("long", "long")
    # Lanes follow the load here (`long_lane_replicas: null`): a document may share a replica with the chats, so
    # only the chats' affinity is a rule; static lanes are tested without Ray in tests/serve/test_routing.py.
    assert h1["x-replica"] == h2["x-replica"]
    assert h2["x-route"] == "affinity"


def test_a_follow_up_without_a_session_lands_where_its_document_is_cached(app: App) -> None:
    """No session id, no `user`: the router finds the document's replica from what the engines publish they hold
    (sglang's own KV events), as a follow-up question on a document does."""
    doc = {"role": "user", "content": words(400, start=500)}
    headers, _ = app.chat([doc])
    holder = headers["x-replica"]
    # The engine's word, not only the router's record of what it sent: the holder publishes the document's pages,
    # and routers have read a publication made after the document finished (stats every 0.5 s) before the follow-up.
    deadline = time.monotonic() + 60
    while app.replica(holder)["held_prefixes"]["pages"] < 6:  # 400 words: at least 400 tokens, 6 whole pages
        assert time.monotonic() < deadline, app.replica(holder)["held_prefixes"]
        time.sleep(0.25)
    time.sleep(3)
    follow_up = [doc, {"role": "assistant", "content": "w7 w8"}, {"role": "user", "content": "w1 w2 w3"}]
    headers, resp = app.chat(follow_up)
    assert (headers["x-replica"], headers["x-route"]) == (holder, "affinity")
    assert resp.choices


def _wait_idle(app: App, replica_id: str, timeout_s: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        info = app.replica(replica_id)
        if not info["active_request_ids"] and info["load"]["num_decoding"] == 0 and info["load"]["num_waiting"] == 0:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"replica still busy after the client left: {info}")
        time.sleep(0.5)


def test_client_disconnect_aborts_the_sglang_request(app: App) -> None:
    body = {
        "model": CHAT_MODEL,
        "messages": USER,
        "max_tokens": 3000,
        "ignore_eos": True,  # sglang's field: the stream runs until we leave
        "stream": True,
    }
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", f"{app.base_url}/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        replica_id = r.headers["x-replica"]
        lines = r.iter_lines()
        seen = [next(lines) for _ in range(3)]
        assert all(line.startswith("data: ") or not line for line in seen)
        busy = app.replica(replica_id)
        assert busy["active_request_ids"]  # still generating when we leave
    # The stream is closed: the ingress cancels the engine call, the replica aborts the request in sglang,
    # and sglang's own load (running and waiting requests) goes back to zero long before 3,000 tokens.
    info = _wait_idle(app, replica_id)
    assert info["counters"]["aborted"] >= 1


def test_the_cpu_config_runs_sglangs_normal_loop(app: App) -> None:
    """`cpu_overlap_schedule: false`: a pass's tokens leave as soon as it has run, no pass after a chat's own."""
    headers, _ = app.chat(USER, session="loop")

    def read() -> dict[str, Any] | None:  # the replica reads its schedulers' state every few polls
        replica = app.replica(headers["x-replica"])
        return replica if replica["scheduler_policy"] else None

    replica = wait_for("the replica's reading of its scheduler's state", read, timeout_s=60, poll_s=1)
    assert replica["policy"]["cpu_overlap_schedule"] is False
    lags = [(s["admission_lag_passes"], s["output_lag_passes"]) for s in replica["scheduler_policy"]]
    assert lags == [(0, 0)]  # one scheduler


def test_live_policy_change_restarts_the_engines_with_it(app: App) -> None:
    """Runs last: sglang reads the policy at start, so a changed policy restarts each engine in place."""
    headers, _ = app.chat(USER, session="policy-1")
    before = app.replica(headers["x-replica"])
    cfg = copy.deepcopy(app.config)
    engine = deployment(cfg, "Engine")
    engine["user_config"]["policy"] = {"short_request_tokens": 512}
    deploy(cfg, timeout_s=DEPLOY_TIMEOUT_S, poll_s=1)
    app.config = cfg
    headers, resp = app.chat(USER, session="policy-2")
    after = app.replica(headers["x-replica"])
    assert after["policy"]["short_request_tokens"] == 512 != before["policy"]["short_request_tokens"]
    assert after["engine_starts"] == before["engine_starts"] + 1
    assert resp.choices  # the restarted engine serves
