"""Strict request rules on their own and behind a small FastAPI app (no Serve)."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, ValidationError

from serve_app.api.request_rules import (
    STRICT_PART,
    STRICT_REQUEST,
    RequestBodyGuard,
    check_context_window,
    check_json_body,
    default_max_body_bytes,
    parse_session_id,
    parsed_body,
    validation_error,
)
from serve_app.protocol.errors import OpenAIError

LIMIT_BYTES = 4096


class Part(BaseModel):
    model_config = STRICT_PART
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = STRICT_REQUEST
    role: Literal["system", "user", "assistant"]
    content: str | list[Part] | None = None


class Chat(BaseModel):
    """The shape of the chat request, with the strict configs as the protocol module adopts them."""

    model_config = STRICT_REQUEST
    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    stream: bool = False


def app() -> TestClient:
    api = FastAPI()

    @api.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return validation_error(exc.errors()).response()

    @api.exception_handler(OpenAIError)
    async def _openai(request: Request, exc: OpenAIError):
        return exc.response()

    @api.post("/v1/chat/completions")
    async def chat(body: Chat) -> dict:
        check_context_window(sum(len(m.content or "") for m in body.messages), body.max_tokens or 16, 1000, "messages")
        return {"stream": body.stream}

    @api.post("/v1/parsed")
    async def parsed(request: Request) -> dict:
        # A route that reads what the guard parsed must not need the body again: the client's bytes are gone.
        request._receive = _no_body  # type: ignore[attr-defined]
        return {"parsed": parsed_body(request)}

    api.add_middleware(RequestBodyGuard, max_body_bytes=LIMIT_BYTES)
    return TestClient(api)


async def _no_body() -> dict:
    raise AssertionError("the route read the body again")


CLIENT = app()
OK = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def post(body: bytes | dict, **headers: str):
    content = json.dumps(body).encode() if isinstance(body, dict) else body
    return CLIENT.post("/v1/chat/completions", content=content, headers={"content-type": "application/json", **headers})


def test_the_guard_hands_the_route_the_body_it_parsed() -> None:
    body = {**OK, "nested": {"list": [1, 2.5, "é"]}}
    r = CLIENT.post("/v1/parsed", content=json.dumps(body).encode(), headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json() == {"parsed": body}


def test_a_good_request_passes_the_guard() -> None:
    r = post({**OK, "stream": True, "temperature": 1})
    assert r.status_code == 200 and r.json() == {"stream": True}


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("stream", "yes", "stream: Input should be a valid boolean (got a string)"),
        ("stream", 1, "stream: Input should be a valid boolean (got a number)"),
        ("max_tokens", "5", "max_tokens: Input should be a valid integer (got a string)"),
        ("max_tokens", True, "max_tokens: Input should be a valid integer (got a boolean)"),
        ("max_tokens", 0, "max_tokens: Input should be greater than or equal to 1"),
        ("max_tokens", -3, "max_tokens: Input should be greater than or equal to 1"),
        ("temperature", "0.5", "temperature: Input should be a valid number (got a string)"),
        ("messages", [], "messages: List should have at least 1 item"),
        ("messages", "hi", "messages: Input should be a valid list (got a string)"),
    ],
)
def test_wrong_types_are_400_naming_the_field(field: str, value, expected: str) -> None:
    r = post({**OK, field: value})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == field and err["message"].startswith(expected)


def test_missing_messages_and_a_secret_value_never_echoed() -> None:
    r = post({"model": "m"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "messages: Field required"
    r = post({**OK, "messages": [{"role": "user", "content": 42}], "stream": "top-secret-prompt"})
    assert r.status_code == 400 and "top-secret-prompt" not in r.text


@pytest.mark.parametrize(
    ("raw", "status", "fragment"),
    [
        (b"", 400, "empty"),
        (b'{"model": "m",', 400, "not valid JSON"),
        (b'{"model": "m", "temperature": NaN}', 400, "NaN is not a JSON number"),
        (b"[1, 2]", 400, "must be a JSON object, not an array"),
        (b'"just a string"', 400, "not a string"),
        (b'{"model": "\xff\xfe"}', 400, "not valid UTF-8 (invalid byte at offset 11)"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}', 400, "unpaired UTF-16 surrogate"),
    ],
)
def test_bad_bodies_are_4xx_with_a_clear_message(raw: bytes, status: int, fragment: str) -> None:
    r = post(raw)
    assert r.status_code == status and fragment in r.json()["error"]["message"]


def test_oversized_body_is_413_whether_declared_or_streamed() -> None:
    big = {**OK, "messages": [{"role": "user", "content": "x" * LIMIT_BYTES}]}
    r = post(big)
    assert r.status_code == 413 and str(LIMIT_BYTES) in r.json()["error"]["message"]

    def chunks():  # no Content-Length: the guard counts what arrives
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}]}'

    r = CLIENT.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_context_window_sizes_are_in_the_message() -> None:
    r = post({**OK, "messages": [{"role": "user", "content": "x" * 990}], "max_tokens": 20})
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded"
    assert (
        "1000 tokens" in err["message"] and "990 prompt tokens" in err["message"] and "max_tokens=20" in err["message"]
    )
    with pytest.raises(OpenAIError, match="max_tokens=1000 does not fit"):
        check_context_window(1, 1000, 1000, "prompt")
    with pytest.raises(OpenAIError, match="at least 1"):
        check_context_window(1, 0, 1000, "prompt")
    check_context_window(500, 500, 1000, "prompt")
    check_context_window(10**9, 5, None, "prompt")


def test_prompt_alone_over_the_window_names_the_prompt() -> None:
    with pytest.raises(OpenAIError) as e:
        check_context_window(1200, 10, 1000, "prompt")
    assert e.value.param == "prompt"


@pytest.mark.parametrize("value", ["", "x" * 257, "tab\there", "naïve", "line\nbreak", "Ā"])
def test_bad_session_ids_name_the_header(value: str) -> None:
    with pytest.raises(OpenAIError) as e:
        parse_session_id(value)
    assert e.value.status == 400 and e.value.param == "X-Session-ID"


def test_good_session_ids_pass() -> None:
    assert parse_session_id(None) is None
    assert parse_session_id("user-42/chat 7") == "user-42/chat 7"
    assert parse_session_id("x" * 256, "user") == "x" * 256
    with pytest.raises(OpenAIError) as e:
        parse_session_id("\n", "user")
    assert e.value.param == "user"


def test_default_body_limit_covers_the_context_window() -> None:
    assert default_max_body_bytes(262_144) == 16 * 262_144
    assert default_max_body_bytes(1000) == 1 << 20
    assert default_max_body_bytes(None) == 8 << 20


def test_strict_configs_refuse_coercion_and_keep_ints_as_numbers() -> None:
    assert Chat.model_validate({**OK, "temperature": 1}).temperature == 1.0
    with pytest.raises(ValidationError):
        Chat.model_validate({**OK, "stream": "true"})
    with pytest.raises(ValidationError):
        Part.model_validate({"type": "text", "text": "a", "extra": 1})


@settings(deadline=None)  # CI shares 2 cores: a slow example is not a failure
@given(st.binary(max_size=200))
def test_any_bytes_are_accepted_or_a_400(raw: bytes) -> None:
    try:
        parsed = check_json_body(raw)
    except OpenAIError as e:
        assert e.status == 400 and e.message
    else:
        assert parsed == json.loads(raw.decode("utf-8")) and isinstance(parsed, dict)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["model", "messages", "max_tokens", "temperature", "stream"]), json_values))
def test_any_json_object_is_answered_without_a_5xx(body: dict) -> None:
    assert post(json.dumps({**OK, **body}).encode()).status_code in {200, 400}
