"""SSE parsing and stream timings: whole streams, cut streams, error events, any network chunking."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from loadtests.sse import SseParser, outcome, token_gaps


def chat_chunk(text: str | None = None, finish: str | None = None, usage: dict | None = None) -> bytes:
    delta = {} if text is None else {"content": text}
    body = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        body = {"object": "chat.completion.chunk", "choices": [], "usage": usage}
    return f"data: {json.dumps(body)}\n\n".encode()


def whole_stream(words: list[str]) -> bytes:
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    usage = {"prompt_tokens": 9, "completion_tokens": len(words), "prompt_tokens_details": {"cached_tokens": 3}}
    return (
        role
        + b"".join(chat_chunk(w) for w in words)
        + chat_chunk(finish="stop")
        + chat_chunk(usage=usage)
        + (b"data: [DONE]\n\n")
    )


def parse(chunks: list[tuple[bytes, float]]) -> SseParser:
    p = SseParser()
    for data, t in chunks:
        p.feed(data, t)
    p.close(chunks[-1][1] if chunks else 0.0)
    return p


@given(st.lists(st.text(alphabet="abcdé ", min_size=1, max_size=5), min_size=1, max_size=20), st.data())
def test_any_chunking_gives_the_same_events(words: list[str], data) -> None:
    raw = whole_stream(words)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=12)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    chunked = parse([(piece, 1.0) for piece in pieces])
    whole = parse([(raw, 1.0)])
    assert [e.data for e in chunked.events] == [e.data for e in whole.events]
    out = outcome(chunked.events, 0.0)
    assert out.error is None
    assert out.output_tokens == len(words)
    assert (out.prompt_tokens, out.cached_tokens) == (9, 3)


def test_timings_come_from_content_events() -> None:
    events = parse(
        [
            (b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n', 0.1),
            (chat_chunk("a"), 0.5),
            (chat_chunk("b"), 0.7),
            (chat_chunk("c") + chat_chunk(finish="stop"), 1.0),
            (b"data: [DONE]\n\n", 1.1),
        ]
    ).events
    out = outcome(events, sent_s=0.0)
    assert out.error is None
    assert out.ttft_s == 0.5  # the role-only chunk is not a token
    assert [round(g, 6) for g in out.itl_s] == [0.2, 0.3]
    assert out.e2e_s == 1.1
    assert out.output_tokens == 3  # no usage chunk: one token a content chunk


def test_a_stream_without_done_is_a_failure() -> None:
    out = outcome(parse([(chat_chunk("a") + chat_chunk("b"), 0.2)]).events, 0.0)
    assert out.error == "stream ended without [DONE]"
    assert out.ttft_s == 0.2


def test_error_events_are_failures() -> None:
    in_body = parse([(chat_chunk("a") + b'data: {"error": {"message": "engine died"}}\n\n', 0.2)]).events
    assert "engine died" in (outcome(in_body, 0.0).error or "")
    named = parse([(b'event: error\ndata: {"message": "x"}\n\n' + b"data: [DONE]\n\n", 0.2)]).events
    assert outcome(named, 0.0).error is not None
    garbage = parse([(b"data: not json\n\n" + b"data: [DONE]\n\n", 0.2)]).events
    assert outcome(garbage, 0.0).error is not None


def test_comments_and_crlf_are_understood() -> None:
    p = parse([(b": keep-alive\r\n\r\n" + chat_chunk("a").replace(b"\n", b"\r\n") + b"data: [DONE]\r\n\r\n", 0.3)])
    out = outcome(p.events, 0.0)
    assert out.error is None and out.output_tokens == 1


@given(st.lists(st.floats(0.001, 1.0), min_size=1, max_size=30), st.integers(1, 4))
def test_chunks_carrying_several_tokens_give_one_gap_per_token(gaps: list[float], k: int) -> None:
    times = [0.0]
    for g in gaps:
        times.append(times[-1] + g)
    tokens = 1 + k * len(gaps)  # the first chunk carries the first token, every later one k tokens
    spread = token_gaps(times, tokens)
    assert len(spread) == tokens - 1
    assert abs(sum(spread) - (times[-1] - times[0])) < 1e-9


@given(st.lists(st.floats(0.001, 1.0), min_size=1, max_size=30), st.integers(0, 100))
def test_uneven_chunks_still_give_one_gap_per_token(gaps: list[float], more: int) -> None:
    # Coalesced chunks carry different token counts (e.g. 15 later tokens over 7 chunks).
    times = [0.0]
    for g in gaps:
        times.append(times[-1] + g)
    tokens = 1 + len(gaps) + more
    spread = token_gaps(times, tokens)
    assert len(spread) == tokens - 1
    assert abs(sum(spread) - (times[-1] - times[0])) < 1e-9
