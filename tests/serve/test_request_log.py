"""Request ids (validated, generated, in every log line) and content-free logs, on a small ASGI app."""

from __future__ import annotations

import logging

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from serve_app.api.request_log import (
    REQUEST_ID_HEADER,
    RequestIdLogFilter,
    RequestIdMiddleware,
    configure_logging,
    loggable_text,
    parse_request_id,
    request_id,
)
from serve_app.protocol.errors import OpenAIError

PROMPT = "my secret prompt about the merger"


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.addFilter(RequestIdLogFilter())
        self.setFormatter(logging.Formatter("[%(request_id)s] %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def capture():
    logger = logging.getLogger("serve_app.test_route")
    handler = Capture()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)


def client(set_response_header: bool = True) -> TestClient:
    api = FastAPI()
    log = logging.getLogger("serve_app.test_route")

    @api.post("/v1/completions")
    async def completions(body: dict) -> dict:
        log.info("prompt %s", loggable_text(body["prompt"]))
        return {"id_seen_by_route": request_id()}

    api.add_middleware(RequestIdMiddleware, set_response_header=set_response_header)
    return TestClient(api)


@pytest.mark.parametrize("value", ["abc", "req-0f3a", "A" * 128, "trace:1.2_x-y"])
def test_sane_ids_are_kept(value: str) -> None:
    assert parse_request_id(value) == value


@pytest.mark.parametrize("value", ["", "-leading", "A" * 129, "has space", "semi;colon", "ünï", "a\tb"])
def test_insane_ids_are_400_without_echoing_them(value: str) -> None:
    with pytest.raises(OpenAIError) as e:
        parse_request_id(value)
    assert e.value.status == 400 and e.value.param == REQUEST_ID_HEADER
    assert value not in e.value.message or not value


def test_client_id_is_echoed_and_logged(capture: Capture) -> None:
    r = client().post("/v1/completions", json={"prompt": PROMPT}, headers={REQUEST_ID_HEADER: "client-42"})
    assert r.status_code == 200 and r.headers[REQUEST_ID_HEADER] == "client-42"
    assert r.json()["id_seen_by_route"] == "client-42"
    assert capture.lines == [f"[client-42] prompt <{len(PROMPT)} chars>"]


def test_generated_id_when_absent_and_distinct_per_request(capture: Capture) -> None:
    c = client()
    ids = {c.post("/v1/completions", json={"prompt": "x"}).headers[REQUEST_ID_HEADER] for _ in range(3)}
    assert len(ids) == 3 and all(i.startswith("req-") for i in ids)
    assert {line.split("]")[0][1:] for line in capture.lines} == ids


def test_behind_serve_the_proxy_sets_the_response_header() -> None:
    r = client(set_response_header=False).post("/v1/completions", json={"prompt": "x"}, headers={"X-Request-ID": "a1"})
    assert REQUEST_ID_HEADER not in r.headers and r.json()["id_seen_by_route"] == "a1"


def test_bad_client_id_is_an_openai_400() -> None:
    r = client().post("/v1/completions", json={"prompt": "x"}, headers={REQUEST_ID_HEADER: "x" * 300})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == REQUEST_ID_HEADER and "x" * 300 not in r.text


def test_no_text_in_logs_unless_opted_in(monkeypatch: pytest.MonkeyPatch, capture: Capture) -> None:
    monkeypatch.delenv("FAIRSHARE_LOG_CONTENT", raising=False)
    assert PROMPT not in loggable_text(PROMPT)
    monkeypatch.setenv("FAIRSHARE_LOG_CONTENT", "1")
    assert PROMPT in loggable_text(PROMPT)


def test_outside_a_request_the_id_is_a_dash(capture: Capture) -> None:
    logging.getLogger("serve_app.test_route").info("start")
    assert capture.lines == ["[-] start"]


def test_configure_logging_is_idempotent() -> None:
    logger = configure_logging("serve_app.test_configure")
    configure_logging("serve_app.test_configure")
    assert len(logger.handlers) == 1 and not logger.propagate
