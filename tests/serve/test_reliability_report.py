"""The reliability report's outcome rules: what counts as answered, shed, failed and lost."""

from __future__ import annotations

import json

import pytest

from benchmarks.reliability_report import (
    ANSWERED,
    FAILED,
    LOST,
    SHED,
    Outcome,
    Tally,
    classify_response,
    classify_stream,
    main,
)


def err(code: str) -> bytes:
    return json.dumps({"error": {"message": "m", "type": "t", "param": None, "code": code}}).encode()


def chunk(finish: str | None = None, text: str = "x") -> str:
    return json.dumps({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]})


def test_complete_json_is_answered() -> None:
    body = json.dumps({"choices": [{"finish_reason": "length", "message": {"content": "hi"}}]}).encode()
    assert classify_response(200, body) == Outcome(ANSWERED)


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (429, err("rate_limit_exceeded"), Outcome(SHED, "429")),
        (503, err("service_unavailable"), Outcome(SHED, "503")),
        (400, err("context_length_exceeded"), Outcome(FAILED, "400:context_length_exceeded")),
        (500, err("engine_failed"), Outcome(FAILED, "500:engine_failed")),
        (500, b"Internal Server Error", Outcome(LOST, "500-without-error-body")),
        (503, b"", Outcome(LOST, "503-without-error-body")),
        (200, b'{"choices": [{"finish_reason": null}]}', Outcome(LOST, "200-without-finish")),
        (200, b"not json", Outcome(LOST, "200-without-finish")),
    ],
)
def test_error_statuses(status: int, body: bytes, expected: Outcome) -> None:
    assert classify_response(status, body) == expected


def test_streams() -> None:
    assert classify_stream([chunk(), chunk("stop"), "[DONE]"]) == Outcome(ANSWERED)
    # Cut before [DONE], or before the finishing chunk: lost.
    assert classify_stream([chunk(), chunk("stop")]) == Outcome(LOST, "stream-cut")
    assert classify_stream([chunk(), chunk()]) == Outcome(LOST, "stream-cut")
    assert classify_stream([]) == Outcome(LOST, "stream-empty")
    # An explicit error event is a failure, not a loss; without [DONE] it says so.
    error_event = err("replica_died").decode()
    assert classify_stream([chunk(), error_event, "[DONE]"]) == Outcome(FAILED, "stream:replica_died")
    assert classify_stream([chunk(), error_event]) == Outcome(FAILED, "stream:replica_died+no-done")


def test_tally_counts_by_kind_and_detail() -> None:
    t = Tally()
    t.add("a", Outcome(SHED, "429"))
    t.add("a", Outcome(SHED, "429"))
    t.add("b", Outcome(LOST, "stream-cut"))
    assert (t.count(SHED), t.count(SHED, "b"), t.lost) == (2, 0, 1)
    assert t.by_detail(SHED) == {"429": 2}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--url", "http://10.0.0.5:8000"], "loopback"),
        (["--burst", "0"], "--burst must be between 1 and 1000 (got 0)"),
        (["--storm", "5000"], "--storm must be between 1 and 1000 (got 5000)"),
    ],
)
def test_bad_arguments_name_the_value(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
