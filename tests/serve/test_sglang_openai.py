"""sglang's OpenAI serving classes driven by the engine replica (`openai_serving`), on stand-ins for the serving
objects: what comes back for each kind of result, unknown fields, request ids, and abort on disconnect.
The same path against real sglang: tests/sglang_cpu/test_serve_sglang.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel
from starlette.responses import JSONResponse, StreamingResponse

from serve_app.engines.sglang.engine_thread import EngineThread
from serve_app.engines.sglang.openai_serving import DisconnectableRequest, SglangOpenAI, openai_error_of, request_ids
from serve_app.replica.backend import ResponseBody, ResponseStart


class FakeTM:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort_request(self, rid: str) -> None:
        self.aborted.append(rid)


class FakeEngine:
    def __init__(self) -> None:
        self.tokenizer_manager = FakeTM()


class Answer(BaseModel):
    id: str
    text: str


class FakeServing:
    """Answers like sglang's serving classes: a response model, a stream, or an error response."""

    def __init__(self, result: Any) -> None:
        self.result = result
        self.requests: list[Any] = []
        self.raw_requests: list[Any] = []

    async def handle_request(self, request: Any, raw_request: Any) -> Any:
        self.requests.append(request)
        self.raw_requests.append(raw_request)
        return self.result()  # a factory: a fresh response per request


def driver(result: Any) -> tuple[SglangOpenAI, FakeServing]:
    from sglang.srt.entrypoints.openai import protocol

    oa = SglangOpenAI(FakeEngine())
    serving = FakeServing(result)
    oa._models = {"chat": protocol.ChatCompletionRequest, "embeddings": protocol.EmbeddingRequest}
    oa._serving = {"chat": serving, "embeddings": serving}
    return oa, serving


async def collect(oa: SglangOpenAI, kind: str, body: dict[str, Any], rid: str = "r1") -> list[Any]:
    return [item async for item in oa.respond(kind, body, rid)]


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_a_response_model_is_json_with_the_routing_request_id() -> None:
    oa, serving = driver(lambda: Answer(id="r1", text="ok"))
    items = asyncio.run(collect(oa, "chat", {**CHAT, "logprobs": True, "n": 2}))
    assert items[0] == ResponseStart(200, "application/json")
    assert json.loads(items[1].data) == {"id": "r1", "text": "ok"}
    (req,) = serving.requests
    assert (req.rid, req.logprobs, req.n) == ("r1", True, 2)  # the client's fields reach sglang unchanged


def test_a_stream_is_relayed_as_its_sse_bytes() -> None:
    async def body():
        yield "data: {}\n\n"
        yield b"data: [DONE]\n\n"

    oa, _ = driver(lambda: StreamingResponse(body(), media_type="text/event-stream"))
    items = asyncio.run(collect(oa, "chat", {**CHAT, "stream": True}))
    assert items == [
        ResponseStart(200, "text/event-stream"),
        ResponseBody(b"data: {}\n\n"),
        ResponseBody(b"data: [DONE]\n\n"),
    ]


def test_an_sglang_error_keeps_its_status_message_and_type_in_openais_shape() -> None:
    error = {"object": "error", "message": "Messages cannot be empty.", "type": "BadRequestError", "code": 400}
    oa, _ = driver(lambda: JSONResponse(error, status_code=400))
    head, body = asyncio.run(collect(oa, "chat", CHAT))
    assert head == ResponseStart(400, "application/json")
    assert json.loads(body.data)["error"] == {
        "message": "Messages cannot be empty.",
        "type": "BadRequestError",
        "param": None,
        "code": None,
    }
    assert openai_error_of(503, b"not json").status == 503


@pytest.mark.parametrize("field", ["not_a_field", "rid"])
def test_a_field_sglang_would_drop_or_routing_owns_is_a_400_naming_it(field: str) -> None:
    oa, serving = driver(lambda: Answer(id="x", text="never"))
    head, body = asyncio.run(collect(oa, "chat", {**CHAT, field: 1}))
    assert head.status == 400 and json.loads(body.data)["error"]["param"] == field
    assert serving.requests == []


def test_an_invalid_value_is_a_400_before_sglang_sees_it() -> None:
    oa, serving = driver(lambda: Answer(id="x", text="never"))
    head, body = asyncio.run(collect(oa, "chat", {**CHAT, "n": "two"}))
    assert head.status == 400 and "n" in json.loads(body.data)["error"]["message"]
    assert serving.requests == []


def test_request_ids_one_per_embedding_input() -> None:
    assert request_ids("embeddings", {"input": ["a", "b"]}, "e") == ["e_0", "e_1"]
    assert request_ids("embeddings", {"input": [1, 2, 3]}, "e") == "e"  # one input as token ids
    assert request_ids("embeddings", {"input": "a"}, "e") == "e"
    assert request_ids("chat", {"n": 3}, "c") == "c"


def test_leaving_mid_stream_aborts_the_request_and_its_choices_in_sglang() -> None:
    async def endless():
        while True:
            yield "data: {}\n\n"
            await asyncio.sleep(0)

    oa, serving = driver(lambda: StreamingResponse(endless(), media_type="text/event-stream"))

    async def go() -> None:
        loop = EngineThread()
        try:
            stream = loop.stream(lambda: oa.respond("chat", {**CHAT, "stream": True, "n": 2}, "r9"))
            seen = [await stream.__anext__() for _ in range(3)]
            assert seen[0] == ResponseStart(200, "text/event-stream")
            await stream.aclose()  # the client left
            for _ in range(100):
                if oa._engine.tokenizer_manager.aborted:
                    break
                await asyncio.sleep(0.01)
            raw = serving.raw_requests[0]
            assert await raw.is_disconnected()  # sglang's own poll now sees the disconnect
        finally:
            loop.stop()

    asyncio.run(go())
    assert oa._engine.tokenizer_manager.aborted == ["r9", "r9_0", "r9_1"]


def test_a_finished_request_is_not_aborted() -> None:
    oa, _ = driver(lambda: Answer(id="r1", text="ok"))
    asyncio.run(collect(oa, "chat", CHAT))
    assert oa._engine.tokenizer_manager.aborted == []


def test_the_disconnect_poll_answers_connected_until_disconnect() -> None:
    async def go() -> tuple[bool, bool]:
        raw = DisconnectableRequest("/v1/chat")
        before = await raw.request.is_disconnected()
        raw.disconnect()
        return before, await raw.request.is_disconnected()

    assert asyncio.run(go()) == (False, True)
