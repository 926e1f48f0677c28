"""The engine replica without Ray: knobs before start, what it hands its backend and relays back, and which engine
failures are client errors; the sim backend's OpenAI answers on engine errors, as the ingress relays them. sglang
is a scripted stand-in here; tests against the real engine live with the CPU sglang environment."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import replace

import pytest

import serve_app.replica.engine_replica as engine_module
from scheduler.slo import SloTargets
from scheduler.traffic import TrafficClass
from serve_app.api import relay
from serve_app.api.endpoints import CHAT, COMPLETIONS
from serve_app.api.ingress import INLINE_TOKENIZE_BYTES, Ingress
from serve_app.api.routed_call import RoutedCall
from serve_app.config import AppConfig, ConfigError, validate
from serve_app.engines.sim.generation import Chunk, RequestError
from serve_app.engines.sim.serving import SimServing
from serve_app.metrics import IngressMetrics, TenantLabels
from serve_app.replica import chat_slo
from serve_app.replica.backend import JSON, SSE, EngineError, OpenAIRequest, ReplicaLoad, ResponseBody, ResponseStart
from serve_app.routing.records import Lane, RouteDecision, RouteHint, RouteReason, RouteTicket
from serve_app.tokenizer import ApproxTokenizer
from tests.serve.fake_sglang import SGLANG_ARGS, FakeSglangEngine, isolate_replica, release_backends

# Serve awaits a deployment's async `__del__`; outside Serve Python calls it and drops the coroutine.
pytestmark = pytest.mark.filterwarnings("ignore:coroutine .*__del__' was never awaited:RuntimeWarning")


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    backends = isolate_replica(monkeypatch)
    yield
    release_backends(backends)


def replica():
    return engine_module.Engine.func_or_class(SGLANG_ARGS)


def req(rid: str = "r1", prompt_tokens: int = 5) -> OpenAIRequest:
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hello"}]}
    return OpenAIRequest("chat", body, rid, session_id="s", prompt_tokens=prompt_tokens)


async def items(rep, request: OpenAIRequest, route: RouteTicket | None = None) -> list:
    return [item async for item in rep.respond(request, route)]


def answering(rep, batches: list[list]) -> list[OpenAIRequest]:
    """Make the replica's backend answer every request with `batches`; the requests it was handed."""
    seen: list[OpenAIRequest] = []

    async def respond(request: OpenAIRequest):
        seen.append(request)
        for batch in batches:
            yield batch

    rep.backend.respond = respond
    return seen


# -- the first user_config is applied before the engine starts ----------------------------------------


def test_first_user_config_policy_is_in_force_when_the_engine_starts() -> None:
    async def go():
        rep = replica()
        await rep.reconfigure({"policy": {"max_running_requests": 4, "mixed_decode": False}})
        await rep.reconfigure(
            {"policy": {"max_running_requests": 4, "mixed_decode": False}, "published_prefix_pages": 8}
        )
        return rep

    rep = asyncio.run(go())
    (engine,) = FakeSglangEngine.started  # started once, not restarted by the second (policy-equal) change
    assert engine.env == {"FAIRSHARE_MAX_RUNNING_REQUESTS": "4", "FAIRSHARE_MIXED_DECODE": "False"}
    assert engine.kwargs["enable_mixed_chunk"] is False  # one switch: the policy's mixed_decode
    assert rep.backend.policy.max_running_requests == 4
    assert rep.knobs.published_prefix_pages == 8


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


# -- what the replica hands its backend, and relays back ----------------------------------------------


def test_the_replica_relays_the_backends_answer_as_it_comes() -> None:
    answer = [[ResponseStart(200, SSE), ResponseBody(b"data: a\n\n")], [ResponseBody(b"data: [DONE]\n\n")]]

    async def go():
        rep = replica()
        await rep.reconfigure({})
        seen = answering(rep, answer)
        return seen, await items(rep, req())

    (seen,), got = asyncio.run(go())
    assert got == answer and seen == req()


def test_the_route_decision_sets_the_requests_class() -> None:
    decision = RouteDecision("Engine#r0", Lane.LONG, TrafficClass.LONG, RouteReason.LEAST_LOADED, 9000, "s")
    ticket = RouteTicket(RouteHint("s", 9000), decision, 0.0)

    async def go():
        rep = replica()
        await rep.reconfigure({})
        seen = answering(rep, [[ResponseStart(200, JSON), ResponseBody(b"{}")]])
        await items(rep, req(), ticket)
        return seen

    (seen,) = asyncio.run(go())
    assert seen.traffic_class is TrafficClass.LONG


def chat_event(text: str = "a") -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"' + text.encode() + b'"}}]}\n\n'


def test_the_replica_publishes_the_share_of_its_latest_chats_that_met_the_slo() -> None:
    """Chats are judged by the targets the router gave them as their bytes leave the replica; documents are not
    judged; the share is published once enough chats were judged (`MIN_JUDGED`)."""
    slo = SloTargets(ttft_s=30.0, tbt_s=0.05)  # a first token always in time; a 0.2 s pause always a miss
    chat = RouteDecision("Engine#r0", Lane.CHAT, TrafficClass.SHORT, RouteReason.LEAST_LOADED, 5, "s", slo=slo)
    doc = RouteDecision("Engine#r0", Lane.LONG, TrafficClass.LONG, RouteReason.LEAST_LOADED, 9000, "s")

    def ticket(decision: RouteDecision) -> RouteTicket:
        return RouteTicket(RouteHint("s", decision.uncached_tokens), decision, 0.0)

    async def respond(request: OpenAIRequest):
        yield [ResponseStart(200, SSE), ResponseBody(chat_event())]
        if request.rid.startswith("slow"):
            await asyncio.sleep(0.2)
        yield [ResponseBody(chat_event() + b"data: [DONE]\n\n")]

    async def go():
        rep = replica()
        await rep.reconfigure({})
        rep.backend.respond = respond
        rep.backend.load = lambda: ReplicaLoad(ready=True)  # not the stand-in's load, which its poll refreshes
        published = []
        for i in range(chat_slo.MIN_JUDGED - 1):
            await items(rep, req(f"fast-{i}"), ticket(chat))
        published.append(rep.record_autoscaling_stats())
        for i in range(3):
            await items(rep, req(f"slow-{i}"), ticket(chat))
            await items(rep, req(f"slow-doc-{i}"), ticket(doc))
        published.append(rep.record_autoscaling_stats())
        return published

    too_few, judged = asyncio.run(go())
    assert "chat_slo_attainment" not in too_few and "chat_ttft_target_s" in too_few  # published, without a share
    total = chat_slo.MIN_JUDGED - 1 + 3
    assert judged["chat_slo_attainment"] == (total - 3) / total


def held_open(rep, rid: str = "doc") -> tuple[asyncio.Event, asyncio.Task]:
    """A request this replica has open until the event is set (its backend answers the head, then waits)."""
    release = asyncio.Event()

    async def respond(request: OpenAIRequest):
        yield [ResponseStart(200, SSE)]
        await release.wait()
        yield [ResponseBody(b"data: [DONE]\n\n")]

    rep.backend.respond = respond
    stream = rep.respond(req(rid))
    return release, asyncio.ensure_future(anext(stream))


def test_over_a_limit_the_replica_refuses_before_its_engine_sees_the_request() -> None:
    async def go():
        rep = replica()
        await rep.reconfigure({"max_queued_prefill_tokens": 100})
        _, opened = held_open(rep)  # a document already queued
        await opened
        rep.backend.load = lambda: ReplicaLoad(prefill_tokens=90)  # not the stand-in's load, which its poll refreshes
        seen = answering(rep, [[ResponseStart(200, JSON), ResponseBody(b"{}")]])
        return seen, await items(rep, req(prompt_tokens=50))

    seen, got = asyncio.run(go())
    assert seen == []
    ((refusal,),) = got
    assert isinstance(refusal, EngineError) and refusal.status == 429 and refusal.retry_after_s


def test_an_engine_reading_of_requests_the_replica_has_answered_is_not_published() -> None:
    """The engine serves only this replica: with no request open here, a reading taken while the last one decoded
    is stale, and routers would predict a decode pass that is not coming. While a request is open, the reading
    stands."""
    stale = ReplicaLoad(num_decoding=1, kv_used_tokens=70, kv_total_tokens=1000, prefill_tok_per_s=5000.0)

    async def go():
        rep = replica()
        await rep.reconfigure({})
        rep.backend.load = lambda: stale  # not the stand-in's load, which its poll refreshes
        idle = rep.record_routing_stats()["load"], rep.admission_load()
        release, opened = held_open(rep)
        await opened
        busy = rep.record_routing_stats()["load"]
        release.set()
        return idle, busy

    (published, admitted), busy = asyncio.run(go())
    assert ReplicaLoad.from_dict(published) == admitted == replace(stale, num_decoding=0)  # capacity and cache kept
    assert ReplicaLoad.from_dict(busy) == stale


def test_requests_arriving_together_are_admitted_up_to_the_limit_not_past_it() -> None:
    """A backend counts a request from its stream's first step, a turn of the loop after the replica admitted it (the
    backend's load stays empty here, as it is in that turn): a request arriving in between must see the admitted
    one. Two at once against a one-request queue: one is served, one refused."""

    async def go():
        rep = replica()
        await rep.reconfigure({"max_queued_requests": 1})
        rep.backend._load = ReplicaLoad()
        seen = answering(rep, [[ResponseStart(200, JSON), ResponseBody(b"{}")]])
        both = await asyncio.gather(items(rep, req("a")), items(rep, req("b")))
        return seen, both, (rep.admission_load(), rep.backend.load())

    seen, (first, second), (after, backend_after) = asyncio.run(go())
    assert [r.rid for r in seen] == ["a"]
    assert first == [[ResponseStart(200, JSON), ResponseBody(b"{}")]]
    ((refusal,),) = second
    assert isinstance(refusal, EngineError) and refusal.status == 429
    # Nothing stays counted beside the backend's own load once the streams ended (the backend refreshes its load).
    assert after == backend_after


def test_a_bug_in_a_backend_is_not_a_client_error() -> None:
    async def go():
        rep = replica()
        await rep.reconfigure({})

        async def broken(request):
            raise ValueError("an index went wrong")
            yield  # pragma: no cover

        rep.backend.respond = broken
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


class FakeMetrics(IngressMetrics):
    """The ingress's metrics, counted in `FakeCounter`s (their counting methods are the real ones)."""

    def __init__(self) -> None:
        self.requests, self.shed, self.tenant_tokens = FakeCounter(), FakeCounter(), FakeCounter()
        self.tenant_label = TenantLabels()

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


def events(body: str) -> list:
    return [line[len("data: ") :] for line in body.split("\n") if line.startswith("data: ")]


def sim_answer(endpoint, chunks: list, stream: bool = True, include_usage: bool = False) -> list[list]:
    """The sim backend's answer to a request whose engine streams `chunks` (an exception in them is raised)."""

    async def generate(request):
        for c in chunks:
            if isinstance(c, Exception):
                raise c
            yield c

    serving = SimServing("m", ApproxTokenizer(), None, 16, generate)
    body = {"model": "m", "stream": stream, **({"stream_options": {"include_usage": True}} if include_usage else {})}
    body |= {"messages": [{"role": "user", "content": "hi"}]} if endpoint is CHAT else {"prompt": "hi"}

    async def go():
        return [batch async for batch in serving.respond(OpenAIRequest(endpoint.name, body, "chatcmpl-1"))]

    return asyncio.run(go())


def relayed(ing: Ingress, endpoint, batches: list[list]) -> str:
    first, *rest = batches
    stream = FakeStream(rest)

    async def go():
        call = RoutedCall("s", 0.0)
        call.first_item_s = 0.001
        return b"".join([part async for part in relay.relay(stream, first, call, endpoint, ing.metrics)])

    return asyncio.run(go()).decode()


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS], ids=lambda e: e.name)
def test_an_engine_error_mid_stream_is_an_sse_error_then_done(endpoint) -> None:
    ing = ingress()
    answer = sim_answer(
        endpoint, [Chunk("Hel", 1, 0, None, 1), RequestError(503, "KV cache pool exhausted")], True, True
    )
    assert answer[-1][-1].error_status == 503
    data = events(relayed(ing, endpoint, answer))
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert (error["message"], error["type"]) == ("KV cache pool exhausted", "server_error")
    assert all('"finish_reason":"stop"' not in d for d in data)
    assert ing.metrics.requests.counts == {(("endpoint", endpoint.name), ("status", "503")): 1}


@pytest.mark.parametrize(
    "chunks",
    [
        [RequestError(400, "needs 300000 KV tokens, the pool holds 262144")],
        [Chunk("a", 1, 0, None, 1), RequestError(400, "needs 300000 KV tokens, the pool holds 262144")],
    ],
    ids=["refused", "aborted"],
)
def test_an_engine_error_in_a_plain_response_is_its_status_and_message(chunks) -> None:
    ((head, body),) = sim_answer(CHAT, chunks, stream=False)
    assert head == ResponseStart(400, JSON)
    error = json.loads(body.data)["error"]
    assert error["type"] == "invalid_request_error" and "262144" in error["message"]


def test_a_finished_stream_has_no_error_and_counts_as_200() -> None:
    ing = ingress()
    answer = sim_answer(CHAT, [Chunk("Hel", 1, 0, None, 1), Chunk("lo", 1, None, "length", 2)])
    data = events(relayed(ing, CHAT, answer))
    chunks = [json.loads(d) for d in data[:-1]]
    assert data[-1] == "[DONE]" and all("error" not in c and "usage" not in c for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]
    assert ing.metrics.requests.counts == {(("endpoint", "chat"), ("status", "200")): 1}


class SlowTokenizer:
    """Tokenizes like the model's tokenizer would a huge prompt: holding its thread for a while."""

    blocking = True

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        return "".join(m["content"] for m in messages)

    def count(self, text: str) -> int:
        return len(self.text_ids(text))

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return self.text_ids(self.render_chat(messages))

    def text_ids(self, text: str) -> list[int]:
        time.sleep(0.3)
        return [ord(c) for c in text]


def test_tokenizing_a_long_prompt_for_routing_leaves_the_event_loop_serving_other_streams() -> None:
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
        body = {"messages": [{"role": "user", "content": "a long document"}]}
        ids, _ = await ing._routing_prompt(CHAT, body, INLINE_TOKENIZE_BYTES + 1)
        ticker.cancel()
        assert ticks > ticks_before  # inline tokenizing would have held the loop: no tick during it
        return len(ids)

    assert asyncio.run(go()) == len("a long document")


def test_a_short_prompt_is_tokenized_on_the_event_loop_without_a_hop_to_a_thread() -> None:
    ing = ingress()
    ing.tokenizer = SlowTokenizer()
    threads: set[int] = set()
    text_ids = ing.tokenizer.text_ids

    def recording(text: str) -> list[int]:
        threads.add(threading.get_ident())
        return text_ids(text)

    ing.tokenizer.text_ids = recording  # type: ignore[method-assign]

    async def go() -> int:
        body = {"messages": [{"role": "user", "content": "a question"}]}
        ids, _ = await ing._routing_prompt(CHAT, body, INLINE_TOKENIZE_BYTES)
        return len(ids)

    assert asyncio.run(go()) == len("a question") and threads == {threading.get_ident()}
