"""The engine replica without Ray: knobs before start (issue 7 defect 1), an sglang abort reaching the client as
an OpenAI error (defect 3), and which engine failures are client errors. sglang is a scripted stand-in here;
tests against the real engine live with the CPU sglang environment."""

from __future__ import annotations

import asyncio
import json
import os
import time
from http import HTTPStatus
from types import SimpleNamespace

import pytest

import serve_app.engine as engine_module
from scheduler.traffic import TrafficClass
from serve_app.config import AppConfig, ConfigError, validate
from serve_app.endpoints import CHAT, COMPLETIONS, ResponseIds
from serve_app.engine_backend import Chunk, EngineError, GenerateRequest
from serve_app.ingress import Ingress, _Call
from serve_app.protocol import OpenAIError
from serve_app.route_records import Lane, RouteDecision, RouteHint, RouteReason, RouteTicket
from serve_app.sglang_backend import SglangBackend
from tests.serve.fake_sglang import FakeSglangEngine, output

# Serve awaits a deployment's async `__del__`; outside Serve Python calls it and drops the coroutine.
pytestmark = pytest.mark.filterwarnings("ignore:coroutine .*__del__' was never awaited:RuntimeWarning")

SGLANG_ARGS = {"backend": "sglang", "sglang": {"model_path": "/models/tiny-llama", "context_length": 4096}}
ABORT_503 = {"type": "abort", "message": "KV cache pool exhausted", "status_code": HTTPStatus.SERVICE_UNAVAILABLE}


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    # The backend exports the policy as FAIRSHARE_* variables: keep them inside the test.
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if not k.startswith("FAIRSHARE_")})
    FakeSglangEngine.started = []
    FakeSglangEngine.script = []
    FakeSglangEngine.policy_state = {}
    ctx = SimpleNamespace(replica_tag="Engine#r0", rank=SimpleNamespace(rank=0), world_size=1)
    monkeypatch.setattr(engine_module.serve, "get_replica_context", lambda: ctx)
    monkeypatch.setattr(
        engine_module, "make_backend", lambda cfg, knobs: SglangBackend(cfg, knobs, engine_factory=FakeSglangEngine)
    )


def replica():
    return engine_module.Engine.func_or_class(SGLANG_ARGS)


def req(rid: str = "r1") -> GenerateRequest:
    return GenerateRequest(rid, "hello", 5, 8, session_id="s", prompt_token_ids=[1, 2, 3, 4, 5])


async def items(rep, request: GenerateRequest, route: RouteTicket | None = None) -> list:
    return [item async for item in rep.generate(request, route)]


# -- defect 1: the first user_config is applied before the engine starts ------------------------------


def test_first_user_config_policy_is_in_force_when_the_engine_starts() -> None:
    async def go():
        rep = replica()
        await rep.reconfigure({"policy": {"max_running_requests": 4, "mixed_decode": False}})
        await rep.reconfigure({"policy": {"max_running_requests": 4, "mixed_decode": False}, "published_sessions": 8})
        return rep

    rep = asyncio.run(go())
    (engine,) = FakeSglangEngine.started  # started once, not restarted by the second (policy-equal) change
    assert engine.env == {"FAIRSHARE_MAX_RUNNING_REQUESTS": "4", "FAIRSHARE_MIXED_DECODE": "False"}
    assert engine.kwargs["enable_mixed_chunk"] is False  # one switch: the policy's mixed_decode
    assert rep.backend.policy.max_running_requests == 4
    assert rep.knobs.published_sessions == 8


@pytest.mark.parametrize(
    ("policy", "named"),
    [
        ({"max_running_requests": 0}, "max_running_requests"),
        ({"interactive_pass_tokens": 99_999}, "interactive_pass_tokens"),
        ({"chunk_budget": 4096}, "chunk_budget"),
    ],
)
def test_a_bad_policy_is_refused_by_name_before_the_engine_starts(policy, named) -> None:
    rep = replica()
    with pytest.raises(ConfigError, match=named):
        asyncio.run(rep.reconfigure({"policy": policy}))
    assert FakeSglangEngine.started == []


def test_a_live_policy_change_on_sglang_restarts_the_engine_with_the_new_policy() -> None:
    async def go():
        rep = replica()
        await rep.reconfigure({"policy": {"max_running_requests": 4, "mixed_decode": False}})
        with pytest.raises(ConfigError, match="max_running_requests"):  # a bad value: no restart, old policy
            await rep.reconfigure({"policy": {"max_running_requests": 0}})
        assert len(FakeSglangEngine.started) == 1
        await rep.reconfigure({"policy": {"max_running_requests": 8}})
        return rep

    rep = asyncio.run(go())
    first, second = FakeSglangEngine.started
    assert first.env == {"FAIRSHARE_MAX_RUNNING_REQUESTS": "4", "FAIRSHARE_MIXED_DECODE": "False"}
    assert second.env == {"FAIRSHARE_MAX_RUNNING_REQUESTS": "8"}  # a dropped override is not inherited
    assert rep.backend.policy.max_running_requests == 8
    assert rep.backend.describe()["engine_starts"] == 2


def test_the_admin_view_shows_the_plugins_live_state() -> None:
    FakeSglangEngine.policy_state = {"status": "active", "pass_cost": {"model": "fitted", "window_passes": 512}}

    async def go():
        rep = replica()
        await rep.reconfigure({})
        deadline = time.monotonic() + 10
        while not rep.backend.describe()["scheduler_policy"] and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        view = await rep.describe()
        await rep.backend.shutdown()
        return view

    view = asyncio.run(go())
    assert view["scheduler_policy"] == [FakeSglangEngine.policy_state]  # one scheduler: one state


def test_mixed_chunk_has_no_second_switch() -> None:
    args = {**SGLANG_ARGS, "sglang": {**SGLANG_ARGS["sglang"], "engine_args": {"enable_mixed_chunk": True}}}
    with pytest.raises(ConfigError, match=r"enable_mixed_chunk -> policy\.mixed_decode"):
        validate(AppConfig, args, "args")


# -- defect 3: an sglang abort is an error, never a `stop` ---------------------------------------------


def test_sglang_abort_ends_the_stream_with_its_status_and_message() -> None:
    FakeSglangEngine.script = [output("Hel", 1), output("Hello", 2, finish=ABORT_503)]

    async def go():
        rep = replica()
        await rep.reconfigure({})
        return rep, await items(rep, req())

    rep, got = asyncio.run(go())
    assert got == [Chunk("Hel", 1, 0, None, 1), EngineError(503, "KV cache pool exhausted")]
    assert rep.backend.counters().num_finished == 0
    assert FakeSglangEngine.started[0].tokenizer_manager.aborted == []  # sglang ended it: nothing to abort


def test_sglang_abort_without_a_status_is_a_server_error() -> None:
    FakeSglangEngine.script = [output("", 0, finish={"type": "abort", "message": "Aborted", "status_code": None})]

    async def go():
        rep = replica()
        await rep.reconfigure({})
        return await items(rep, req())

    assert asyncio.run(go()) == [EngineError(500, "Aborted")]


def test_normal_ends_map_to_stop_and_length() -> None:
    FakeSglangEngine.script = [output("a", 1), output("ab", 2, finish={"type": "length", "length": 2})]

    async def go():
        rep = replica()
        await rep.reconfigure({})
        first = await items(rep, req("r1"))
        FakeSglangEngine.script = [output("a.", 2, finish={"type": "stop", "matched": 2})]
        second = await items(rep, req("r2"))
        return rep, first, second

    rep, first, second = asyncio.run(go())
    assert [c.finish_reason for c in first] == [None, "length"]
    assert [c.finish_reason for c in second] == ["stop"]
    assert rep.backend.counters().num_finished == 2


def test_the_route_decision_sets_the_requests_class() -> None:
    FakeSglangEngine.script = [output("a", 1, finish={"type": "length"})]
    decision = RouteDecision("Engine#r0", Lane.LONG, TrafficClass.LONG, RouteReason.LEAST_LOADED, 9000, "s")
    ticket = RouteTicket(RouteHint("s", 9000), decision, 0.0)

    async def go():
        rep = replica()
        await rep.reconfigure({})
        seen = []
        original = rep.backend.generate

        def spy(request):
            seen.append(request)
            return original(request)

        rep.backend.generate = spy
        await items(rep, req(), ticket)
        return seen

    (seen,) = asyncio.run(go())
    assert seen.traffic_class is TrafficClass.LONG


def test_a_bug_in_a_backend_is_not_a_client_error() -> None:
    async def go():
        rep = replica()
        await rep.reconfigure({})

        async def broken(request):
            raise ValueError("an index went wrong")
            yield  # pragma: no cover

        rep.backend.generate = broken
        return await items(rep, req())

    with pytest.raises(ValueError, match="an index went wrong"):  # Serve answers it as a 500
        asyncio.run(go())


# -- the ingress pipeline on engine errors -----------------------------------------------------------


class FakeCounter:
    def __init__(self) -> None:
        self.counts: dict[tuple, int] = {}

    def inc(self, value: int = 1, tags: dict | None = None) -> None:
        key = tuple(sorted((tags or {}).items()))
        self.counts[key] = self.counts.get(key, 0) + value


class FakeMetrics:
    def __init__(self) -> None:
        self.requests, self.shed = FakeCounter(), FakeCounter()

    def observe_ttft(self, *a) -> None: ...

    def observe_itl(self, *a) -> None: ...


class FakeStream:
    def __init__(self, rest) -> None:
        self.rest = list(rest)
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.rest:
            raise StopAsyncIteration
        return self.rest.pop(0)

    def cancel(self) -> None:
        self.cancelled = True


def ingress() -> Ingress:
    ing = object.__new__(Ingress.func_or_class)
    ing.metrics = FakeMetrics()
    return ing


def call() -> _Call:
    c = _Call(ResponseIds("chatcmpl-1", 0, "m"), "s", 5, 0.0)
    c.first_item_s = 0.001
    return c


def events(body: str) -> list:
    return [line[len("data: ") :] for line in body.split("\n") if line.startswith("data: ")]


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS], ids=lambda e: e.name)
def test_an_engine_error_mid_stream_is_an_sse_error_then_done(endpoint) -> None:
    ing = ingress()
    first = Chunk("Hel", 1, 0, None, 1)
    stream = FakeStream([EngineError(503, "KV cache pool exhausted")])

    async def go():
        return "".join([part async for part in ing._sse(endpoint, stream, first, call(), include_usage=True)])

    data = events(asyncio.run(go()))
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert (error["message"], error["type"]) == ("KV cache pool exhausted", "server_error")
    assert all('"finish_reason":"stop"' not in d for d in data)
    assert ing.metrics.requests.counts == {(("endpoint", endpoint.name), ("status", "503")): 1}
    assert not stream.cancelled  # the engine ended it


def test_an_engine_error_in_a_plain_response_is_its_status_and_message() -> None:
    ing = ingress()
    stream = FakeStream([EngineError(400, "needs 300000 KV tokens, the pool holds 262144")])

    async def go():
        await ing._collect(CHAT, stream, Chunk("a", 1, 0, None, 1), call())

    with pytest.raises(OpenAIError) as e:
        asyncio.run(go())
    assert (e.value.status, e.value.type) == (400, "invalid_request_error")
    assert "262144" in e.value.message


def test_a_finished_stream_has_no_error_and_counts_as_200() -> None:
    ing = ingress()
    stream = FakeStream([Chunk("lo", 1, None, "length", 2)])

    async def go():
        return "".join([p async for p in ing._sse(CHAT, stream, Chunk("Hel", 1, 0, None, 1), call(), False)])

    data = events(asyncio.run(go()))
    chunks = [json.loads(d) for d in data[:-1]]
    assert data[-1] == "[DONE]" and all("error" not in c and "usage" not in c for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]
    assert ing.metrics.requests.counts == {(("endpoint", "chat"), ("status", "200")): 1}


class SlowTokenizer:
    """Counts like the model's tokenizer would on a huge prompt: holding its thread for a while."""

    blocking = True

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        return "".join(m["content"] for m in messages)

    def count(self, text: str) -> int:
        time.sleep(0.3)
        return len(text)


def test_counting_a_long_prompt_for_routing_leaves_the_event_loop_serving_other_streams() -> None:
    ing = ingress()
    ing.tokenizer = SlowTokenizer()
    ticks = 0

    async def other_stream() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async def go() -> int:
        ticker = asyncio.create_task(other_stream())
        await asyncio.sleep(0)  # the other stream is running when the request arrives
        ticks_before = ticks
        n = await ing._routing_tokens(CHAT, {"messages": [{"role": "user", "content": "a long document"}]})
        ticker.cancel()
        assert ticks > ticks_before  # inline counting would have held the loop: no tick during the count
        return n

    assert asyncio.run(go()) == len("a long document")
