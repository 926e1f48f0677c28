"""A replica's own judgement of its chats (`serve_app.replica.chat_slo`): the ingress's rule on the bytes as they
leave the replica, and the share of the latest verdicts that the SLO autoscaling policy reads."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler.slo import SloTargets, StreamLatency, meets_slo
from serve_app.replica.backend import JSON, SSE, EngineError, ResponseBody, ResponseStart
from serve_app.replica.chat_slo import MIN_JUDGED, ChatJudge, RecentAttainment

TARGETS = SloTargets(ttft_s=0.5, tbt_s=0.1)
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'


def content(text: str = "a") -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"' + text.encode() + b'"}}]}\n\n'


def test_the_clock_starts_at_receipt_and_stops_at_the_first_text_not_the_opening() -> None:
    judge = ChatJudge("chat", TARGETS, started_s=10.0)
    judge.sent([ResponseStart(200, SSE), ResponseBody(ROLE)], 10.1)
    judge.sent([ResponseBody(content())], 10.6)  # the first text 0.6 s after receipt: over the TTFT target
    assert judge.verdict() is False


def test_a_chat_within_both_targets_meets_them_and_one_long_gap_misses() -> None:
    met = ChatJudge("chat", TARGETS, started_s=0.0)
    missed = ChatJudge("completions", TARGETS, started_s=0.0)
    for judge, field in ((met, b"content"), (missed, b"text")):
        judge.sent([ResponseStart(200, SSE), ResponseBody(b'data: {"choices":[{"' + field + b'":"x"}]}\n\n')], 0.2)
    met.sent([ResponseBody(content() * 2)], 0.3)  # two tokens in 0.1 s: 0.05 s a gap
    missed.sent([ResponseBody(b'data: {"choices":[{"text":"y"}]}\n\n')], 0.45)  # one gap of 0.25 s
    assert met.verdict() is True and missed.verdict() is False


def test_a_whole_response_is_its_first_token_and_an_error_is_not_judged() -> None:
    whole = ChatJudge("chat", TARGETS, started_s=0.0)
    whole.sent([ResponseStart(200, JSON), ResponseBody(b'{"choices":[{"message":{"content":"hi"}}]}')], 0.3)
    assert whole.verdict() is True
    cut = ChatJudge("chat", TARGETS, started_s=0.0)
    cut.sent([ResponseStart(200, SSE), ResponseBody(content())], 0.1)
    cut.sent([ResponseBody(b'data: {"error":{"code":503}}\n\n', error_status=503)], 0.2)
    refused = ChatJudge("chat", TARGETS, started_s=0.0)
    refused.sent([EngineError(429, "full")], 0.0)
    error_response = ChatJudge("chat", TARGETS, started_s=0.0)
    error_response.sent([ResponseStart(400, JSON), ResponseBody(b'{"error":{}}')], 0.0)
    assert cut.verdict() is None and refused.verdict() is None and error_response.verdict() is None


def test_an_answer_of_tool_calls_alone_is_timed_from_its_first_call() -> None:
    call = b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}\n\n'
    streamed = ChatJudge("chat", TARGETS, started_s=0.0)
    streamed.sent([ResponseStart(200, SSE), ResponseBody(ROLE)], 0.1)
    streamed.sent([ResponseBody(call)], 0.3)
    streamed.sent([ResponseBody(call)], 0.35)
    whole = ChatJudge("chat", TARGETS, started_s=0.0)
    whole.sent(
        [ResponseStart(200, JSON), ResponseBody(b'{"choices":[{"message":{"content":null,"tool_calls":[]}}]}')], 0.2
    )
    late = ChatJudge("chat", TARGETS, started_s=0.0)
    late.sent([ResponseStart(200, SSE), ResponseBody(ROLE)], 0.1)
    late.sent([ResponseBody(call)], 0.7)  # the first call 0.7 s after receipt: over the TTFT target
    assert streamed.verdict() is True and whole.verdict() is True and late.verdict() is False


def test_the_share_counts_the_windows_verdicts_and_says_nothing_below_the_minimum() -> None:
    recent = RecentAttainment(window_s=20.0, min_judged=4)
    for at_s, met in ((0.0, False), (1.0, True), (2.0, True)):
        recent.add(met, at_s)
    assert recent.share(2.0) is None  # three verdicts: too few
    recent.add(True, 3.0)
    assert recent.share(3.0) == 0.75
    recent.add(True, 20.5)  # the missed one, at 0.0, leaves the window
    assert recent.share(20.5) == 1.0 and RecentAttainment().min_judged == MIN_JUDGED


@given(st.lists(st.tuples(st.floats(0, 100), st.booleans()), max_size=60), st.floats(1, 50))
def test_the_share_is_the_met_fraction_of_the_verdicts_inside_the_window(verdicts, window_s) -> None:
    verdicts = sorted(verdicts)
    recent = RecentAttainment(window_s=window_s, min_judged=1)
    for at_s, met in verdicts:
        recent.add(met, at_s)
    now_s = verdicts[-1][0] if verdicts else 0.0
    inside = [met for at_s, met in verdicts if at_s >= now_s - window_s]
    assert recent.share(now_s) == (sum(inside) / len(inside) if inside else None)


@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 0.5)), max_size=30), st.floats(0.01, 1), st.floats(0.01, 1))
def test_stream_latency_judges_as_meets_slo_on_its_first_arrival_and_spread_gaps(arrivals, ttft_s, tbt_s) -> None:
    """The one rule the ingress's `StreamTimer` and the replica's judge share, against its definition."""
    latency, at_s, first, gaps = StreamLatency(0.0), 0.0, None, []
    for n, after_s in arrivals:
        at_s += after_s
        latency.tokens(n, at_s)
        if n and first is None:
            first, last = at_s, at_s
        elif n:
            gaps.append((at_s - last) / n)
            last = at_s
    targets = SloTargets(ttft_s=ttft_s, tbt_s=tbt_s)
    assert latency.ttft_s == first and latency.gaps_s == gaps
    assert latency.meets(targets) == meets_slo(targets, first, gaps)
