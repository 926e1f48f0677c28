"""`chat_path.answer_of`: a streamed document answer's time to first content and its text, from the SSE events."""

from __future__ import annotations

import json

import pytest

from benchmarks.chat_path import answer_of
from loadtests.sse import SseEvent


def chunk(t_s: float, content: str) -> SseEvent:
    return SseEvent(t_s, json.dumps({"choices": [{"index": 0, "delta": {"content": content}}]}))


def test_a_whole_stream_gives_its_first_content_time_and_its_text():
    events = [
        SseEvent(10.1, json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})),
        chunk(10.5, "Short "),
        chunk(10.6, "answer."),
        SseEvent(10.7, "[DONE]"),
    ]
    ttft, text = answer_of(events, sent=10.0)
    assert ttft == pytest.approx(0.5)
    assert text == "Short answer."


@pytest.mark.parametrize(
    "events",
    [
        [chunk(10.5, "cut off")],  # no [DONE]
        [chunk(10.5, "x"), SseEvent(10.6, json.dumps({"error": {"message": "aborted"}}), "error")],
        [SseEvent(10.7, "[DONE]")],  # no content
    ],
)
def test_a_broken_or_empty_stream_is_an_error_not_a_time(events):
    with pytest.raises(RuntimeError, match="a document's answer"):
        answer_of(events, sent=10.0)
