"""TTFT and ITL at the ingress, and each response judged against its SLO targets: one rule (`StreamTimer`) on the
relayed bytes, whichever backend wrote them."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    DeltaMessage,
    FunctionResponse,
    ToolCall,
)
from sglang.srt.entrypoints.openai.sse_utils import build_sse_content

import serve_app.api.relay as relay_module
from scheduler.slo import SloTargets
from scheduler.traffic import TrafficClass
from serve_app.api.endpoints import CHAT
from serve_app.api.routed_call import RoutedCall
from serve_app.engines.sim.formats import FORMATS, ResponseIds
from serve_app.engines.sim.generation import Chunk
from serve_app.engines.sim.serving import SimServing
from serve_app.metrics import IngressMetrics, StreamTimer, TenantLabels
from serve_app.protocol.openai_models import Usage
from serve_app.protocol.sse import EventTemplate, output_events, sse
from serve_app.replica.backend import JSON, SSE, OpenAIRequest, ReplicaLoad, ResponseBody, ResponseStart
from serve_app.routing.records import Lane, ReplicaView, RouteDecision, RouteReason, RoutingStats
from serve_app.tokenizer import ApproxTokenizer
from tests.serve.test_engine_replica import FakeCounter, FakeStream

IDS = ResponseIds("chatcmpl-1", 1700000000, "m")


class RecordingMetrics(IngressMetrics):
    def __init__(self) -> None:
        self.requests, self.shed, self.slo = FakeCounter(), FakeCounter(), FakeCounter()
        self.tenant_tokens = FakeCounter()
        self.tenant_label = TenantLabels()
        self.ttft: list[tuple[str, str, float]] = []
        self.itl: list[tuple[str, str, float]] = []

    def observe_ttft(self, lane: str, cls: str, seconds: float) -> None:
        self.ttft.append((lane, cls, seconds))

    def observe_itl(self, lane: str, cls: str, seconds: float) -> None:
        self.itl.append((lane, cls, seconds))


# -- the rule ---------------------------------------------------------------------------------------


def test_first_arrival_is_ttft_later_ones_spread_their_gap_and_empty_ones_count_nothing() -> None:
    m = RecordingMetrics()
    timer = StreamTimer(m, "chat", "short", received_s=10.0)
    timer.tokens(0, 10.1)  # e.g. the role chunk alone: no token yet
    timer.tokens(1, 10.2)
    timer.tokens(4, 10.6)
    timer.tokens(0, 10.7)  # finish, usage, [DONE]
    timer.tokens(1, 10.8)
    assert [round(s, 6) for *_, s in m.ttft] == [0.2]
    assert [round(s, 6) for *_, s in m.itl] == [0.1, 0.2]  # 0.4 s over 4 tokens; then 0.2 s since the last tokens
    assert {t[:2] for t in m.ttft + m.itl} == {("chat", "short")}


def slo_counts(m: RecordingMetrics) -> dict[str, str]:
    """target -> outcome of the one request counted."""
    assert all(n == 1 for n in m.slo.counts.values())
    return {dict(k)["target"]: dict(k)["outcome"] for k in m.slo.counts}


CHAT_SLO = SloTargets(ttft_s=0.5, tbt_s=0.3)


def test_a_finished_stream_is_counted_within_or_over_each_of_its_targets() -> None:
    m = RecordingMetrics()
    timer = StreamTimer(m, "chat", "short", received_s=10.0, slo=CHAT_SLO)
    for at_s in (10.4, 10.5, 10.9, 11.0):  # TTFT 0.4 s; gaps 0.1, 0.4 (over), 0.1
        timer.tokens(1, at_s)
    timer.finish()
    assert slo_counts(m) == {"ttft": "within", "tbt": "over", "all": "over"}
    assert {(dict(k)["lane"], dict(k)["traffic_class"]) for k in m.slo.counts} == {("chat", "short")}


def test_the_tbt_target_is_the_p99_of_a_streams_gaps() -> None:
    # 200 gaps: the p99 (nearest rank) is the 198th smallest, so two stalls over the target still meet it.
    m = RecordingMetrics()
    timer = StreamTimer(m, "chat", "short", received_s=0.0, slo=CHAT_SLO)
    at_s = 0.3
    timer.tokens(1, at_s)
    for i in range(200):
        at_s += 0.9 if i in (50, 150) else 0.05
        timer.tokens(1, at_s)
    timer.finish()
    assert slo_counts(m) == {"ttft": "within", "tbt": "within", "all": "within"}


def test_a_class_without_targets_is_not_counted() -> None:
    m = RecordingMetrics()
    timer = StreamTimer(m, "long", "long", received_s=0.0)
    timer.tokens(1, 30.0)
    timer.finish()
    assert m.slo.counts == {}


def test_a_route_carries_its_class_targets_from_the_replica_that_serves_it() -> None:
    stats = RoutingStats.from_dict(
        RoutingStats(Lane.BOTH, ReplicaLoad(), 2048, 0.0, interactive_slo=CHAT_SLO).to_dict()
    )
    view = ReplicaView.from_stats("r0", stats)
    assert view.slo_for(TrafficClass.SHORT) == CHAT_SLO
    assert view.slo_for(TrafficClass.LONG) == SloTargets()  # documents are not judged on latency
    assert RoutingStats.from_dict({}).interactive_slo == SloTargets()  # nothing published yet: nothing judged


# -- counting text-bearing events without decoding JSON --------------------------------------------


def _our_stream(fmt, texts: list[str], include_usage: bool) -> bytes:
    exclude = None if include_usage else {"usage"}
    template = EventTemplate(fmt.delta(IDS, EventTemplate.SLOT), exclude=exclude)
    events = [sse(e, exclude=exclude) for e in fmt.opening(IDS)] + [template(t) for t in texts]
    events.append(sse(fmt.finish(IDS, "stop"), exclude=exclude))
    if include_usage:
        events.append(sse(fmt.usage(IDS, Usage.of(3, len(texts), 0))))
    return "".join([*events, sse("[DONE]")]).encode()


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: f.endpoint.name)
@given(texts=st.lists(st.text(min_size=1), max_size=8), include_usage=st.booleans())
def test_every_delta_with_text_counts_once_and_nothing_else_does(fmt, texts: list[str], include_usage) -> None:
    assert output_events(_our_stream(fmt, texts, include_usage), fmt.endpoint.text_field) == len(texts)


sglang_chunk = functools.partial(build_sse_content, chunk_id="chatcmpl-1", created=0, model="m", index=0)
"""A chat chunk as sglang's serving class writes it, for the fields given."""


@given(texts=st.lists(st.text(min_size=1), max_size=8))
def test_sglangs_own_chat_chunks_count_as_their_text_deltas(texts: list[str]) -> None:
    events = [sglang_chunk(role="assistant", content="")]
    events += [sglang_chunk(content=t) for t in texts]
    events += [sglang_chunk(finish_reason="stop"), "data: [DONE]\n\n"]
    assert output_events("".join(events).encode(), CHAT.text_field) == len(texts)
    assert output_events(events[0].encode(), CHAT.text_field) == 0  # the role chunk comes with the first output


def sglang_tool_call_chunk(name: str | None, arguments: str) -> str:
    """A streamed tool call's chunk as sglang's serving class writes it: a delta with the call and no text."""
    call = ToolCall(index=0, function=FunctionResponse(name=name, arguments=arguments))
    choice = ChatCompletionResponseStreamChoice(index=0, delta=DeltaMessage(tool_calls=[call]))
    return f"data: {ChatCompletionStreamResponse(id='chatcmpl-1', model='m', choices=[choice]).model_dump_json()}\n\n"


@given(thoughts=st.lists(st.text(min_size=1), max_size=4), fragments=st.lists(st.text(), max_size=4))
def test_sglangs_reasoning_and_tool_call_chunks_are_output_without_text(thoughts: list[str], fragments) -> None:
    """A reasoning model thinks before it answers, and a tool-calling agent's answer may be calls alone: both are
    generated output, the first of it the time to first token."""
    events = [sglang_chunk(role="assistant", content="")]
    events += [sglang_chunk(reasoning_content=t) for t in thoughts]
    events += [sglang_tool_call_chunk("get_weather", "")]
    events += [sglang_tool_call_chunk(None, f) for f in fragments]
    events += [sglang_chunk(finish_reason="tool_calls"), "data: [DONE]\n\n"]
    assert output_events("".join(events).encode(), CHAT.text_field) == len(thoughts) + 1 + len(fragments)


def test_text_that_quotes_a_field_name_is_one_event() -> None:
    quoting = sglang_chunk(content='{"tool_calls": [], "reasoning_content": "x", "text": "y"}')
    assert output_events(quoting.encode(), CHAT.text_field) == 1


def test_an_error_event_carries_no_text() -> None:
    error = b'data: {"error": {"message": "aborted", "type": "server_error", "code": 503}}\n\ndata: [DONE]\n\n'
    assert output_events(error, "content") == output_events(error, "text") == 0


# -- every backend's bytes, relayed, observe the same -----------------------------------------------


def call() -> RoutedCall:
    c = RoutedCall("s", received_s=0.0)
    c.first_item_s = 0.25
    c.decision = RouteDecision("r0", Lane.CHAT, TrafficClass.SHORT, RouteReason.LEAST_LOADED, 5, "s", CHAT_SLO)
    return c


@pytest.fixture
def clock(monkeypatch):
    """The relay's `time.perf_counter`, one second later at each read (arrival times the test can name)."""
    ticks = itertools.count(1)
    monkeypatch.setattr(relay_module.time, "perf_counter", lambda: float(next(ticks)))


def sim_batches(chunks: list[Chunk], stream: bool) -> list[list]:
    """What the sim backend writes for these chunks (`sim.serving`), one list per engine-replica stream item."""

    async def generate(request):
        for c in chunks:
            yield c

    serving = SimServing("m", ApproxTokenizer(), None, 16, generate)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}

    async def go():
        return [batch async for batch in serving.respond(OpenAIRequest("chat", body, "chatcmpl-1"))]

    return asyncio.run(go())


def test_the_sim_backends_stream_observes_ttft_at_the_first_text_and_itl_per_text_event(clock) -> None:
    m = RecordingMetrics()
    first, *rest = sim_batches(
        [Chunk("a", 1, 0, None, 1), Chunk("b", 1, None, None, 2), Chunk("cde", 3, None, "length", 5)], True
    )
    stream = FakeStream(rest)

    async def go():
        return [p async for p in relay_module.relay(stream, first, call(), CHAT, m)]

    asyncio.run(go())
    assert [s for *_, s in m.ttft] == [0.25]  # the first item, which carries the first text
    assert [s for *_, s in m.itl] == [0.75, 1.0]  # t=1 after 0.25; t=2 after t=1, for one event (three tokens)
    assert m.requests.counts == {(("endpoint", "chat"), ("status", "200")): 1}
    assert slo_counts(m) == {"ttft": "within", "tbt": "over", "all": "over"}  # judged by the route's targets


def test_a_whole_response_observes_ttft_when_its_text_arrives(clock) -> None:
    m = RecordingMetrics()
    first, *rest = sim_batches([Chunk("a", 1, 0, None, 1), Chunk("b", 1, None, "stop", 2)], False)
    assert first[0] == ResponseStart(200, JSON) and rest == []  # written whole, once the engine finished

    async def go():
        return await relay_module.whole_body(FakeStream(rest), first, call(), CHAT, m, timed=True)

    assert json.loads(asyncio.run(go()))["choices"][0]["message"]["content"] == "ab"
    assert [s for *_, s in m.ttft] == [0.25] and m.itl == []
    assert slo_counts(m) == {"ttft": "within", "tbt": "within", "all": "within"}  # its tokens arrive together


def test_an_error_response_is_neither_timed_nor_judged(clock) -> None:
    m = RecordingMetrics()
    body = b'{"error": {"message": "bad", "type": "invalid_request_error", "code": 400}}'

    async def go():
        return await relay_module.whole_body(
            FakeStream([]), [ResponseStart(400, JSON), ResponseBody(body)], call(), CHAT, m, timed=False
        )

    assert asyncio.run(go()) == body
    assert m.ttft == [] and m.slo.counts == {}


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: f.endpoint.name)
def test_the_sglang_relay_observes_the_same_from_the_sse_bytes(clock, fmt) -> None:
    endpoint = fmt.endpoint
    m = RecordingMetrics()
    opening = "".join(sse(e) for e in fmt.opening(IDS))
    events = _our_stream(fmt, ["a", "b", "c", "d"], include_usage=True).decode().split("\n\n")[:-1]
    events = [e + "\n\n" for e in events]
    skip = 1 if opening else 0  # chat opens with the role chunk; the relay sees it with the first delta
    items = [
        "".join(events[: skip + 1]),  # t=1: the first text (TTFT)
        events[skip + 1],  # t=2: one more
        "".join(events[skip + 2 : skip + 4]),  # t=3: two more in one item
        "".join(events[skip + 4 :]),  # t=4: finish, usage, [DONE]: no text
    ]
    first = [ResponseStart(200, SSE)]  # sglang's head comes alone, before its first output
    stream = FakeStream([[ResponseBody(i.encode())] for i in items])
    c = call()

    async def go():
        return b"".join([p async for p in relay_module.relay(stream, first, c, endpoint, m)])

    assert asyncio.run(go()) == "".join(events).encode()  # relayed unchanged
    assert [s for *_, s in m.ttft] == [1.0]
    assert [s for *_, s in m.itl] == [1.0, 0.5]
    assert m.requests.counts == {(("endpoint", endpoint.name), ("status", "200")): 1}
    assert not stream.cancelled
    assert slo_counts(m) == {"ttft": "over", "tbt": "over", "all": "over"}  # the same verdicts as the sim path


def test_a_stream_the_engine_ended_with_an_error_is_counted_with_it_and_not_judged(clock) -> None:
    m = RecordingMetrics()
    text = _our_stream(FORMATS["chat"], ["a"], include_usage=False)
    error = b'data: {"error": {"message": "aborted", "type": "server_error", "code": 503}}\n\ndata: [DONE]\n\n'
    stream = FakeStream([[ResponseBody(text[: text.index(b"data: [DONE]")])], [ResponseBody(error, 503)]])

    async def go():
        return [p async for p in relay_module.relay(stream, [ResponseStart(200, SSE)], call(), CHAT, m)]

    asyncio.run(go())
    assert [s for *_, s in m.ttft] == [1.0]  # its text was timed as it came
    assert m.requests.counts == {(("endpoint", "chat"), ("status", "503")): 1}
    assert m.slo.counts == {}  # it did not end normally: no verdict
