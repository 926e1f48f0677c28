"""Backpressure decisions on synthetic replica loads: no Ray, no HTTP."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from serve_app.replica.backend import ReplicaLoad
from serve_app.routing.backpressure import (
    Admit,
    BackpressureLimits,
    Shed,
    ShedReason,
    assess,
    decide,
    derive_limits,
    retry_after_s,
)

LIMITS = BackpressureLimits(max_queued_requests=4, max_queued_prefill_tokens=100_000, prefill_tokens_per_s=1000.0)


def load(waiting: int = 0, prefilling: int = 0, decoding: int = 0, tokens: int = 0) -> ReplicaLoad:
    return ReplicaLoad(num_waiting=waiting, num_prefilling=prefilling, num_decoding=decoding, prefill_tokens=tokens)


def test_idle_replica_admits() -> None:
    assert assess(load(), 30, LIMITS).admits


def test_each_limit_refuses_with_its_reason() -> None:
    assert assess(load(waiting=2, prefilling=2), 30, LIMITS).reason is ShedReason.QUEUED
    v = assess(load(waiting=1, tokens=90_000), 20_000, LIMITS)
    assert v.reason is ShedReason.PREFILL_TOKENS and v.excess_tokens == 10_000


def test_a_document_is_tokens_of_load_not_one_request() -> None:
    # One queued 130k-token document fills the token queue; a second document is refused although
    # only one request waits, while a 30-token chat still fits.
    busy = load(waiting=1, tokens=95_000)
    assert not assess(busy, 30_000, LIMITS).admits
    assert assess(busy, 30, LIMITS).admits


def test_requests_in_flight_are_serves_limit_not_a_reason_to_shed() -> None:
    # Serve sends a replica at most `max_ongoing_requests`; however many decode there, a chat's queue is what counts.
    assert assess(load(decoding=500), 30, LIMITS).admits
    assert assess(load(waiting=4, decoding=4), 30, LIMITS).reason is ShedReason.QUEUED


def test_an_empty_token_queue_takes_a_document_larger_than_the_limit() -> None:
    # Otherwise a window-sized document could never run anywhere.
    assert assess(load(decoding=3), 250_000, LIMITS).admits
    assert not assess(load(waiting=1, tokens=1), 250_000, LIMITS).admits


def test_decide_admits_to_every_replica_that_takes_it() -> None:
    loads = {"a": load(waiting=4), "b": load(), "c": load(decoding=8), "d": load(waiting=1, tokens=99_990)}
    assert decide(loads, 30, LIMITS) == Admit(("b", "c"))


def test_per_replica_tokens_follow_the_session_cache() -> None:
    # The session's prefix is cached on "a": only there is the request small enough to fit.
    loads = {"a": load(waiting=1, tokens=90_000), "b": load(waiting=1, tokens=90_000)}
    assert decide(loads, {"a": 500, "b": 40_000}, LIMITS) == Admit(("a",))


def test_no_replica_is_503_with_retry_after() -> None:
    shed = decide({}, 30, LIMITS)
    assert isinstance(shed, Shed)
    assert (shed.status, shed.reason, shed.error().headers) == (503, ShedReason.NO_REPLICA, {"Retry-After": "1"})
    body = shed.error().body()["error"]
    assert (body["type"], body["code"]) == ("server_error", "service_unavailable")


def test_all_full_is_429_with_an_openai_error_body() -> None:
    shed = decide({"a": load(waiting=4), "b": load(waiting=1, tokens=99_990)}, 30, LIMITS)
    assert isinstance(shed, Shed)
    assert shed.status == 429 and shed.reason is ShedReason.QUEUED
    error = shed.error()
    assert (error.status, error.headers) == (429, {"Retry-After": "1"})
    body = error.body()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    assert body["type"] == body["code"] == "rate_limit_exceeded" and "4 requests waiting" in body["message"]


def test_token_shed_retry_after_is_the_least_excess_at_the_prefill_rate() -> None:
    loads = {"a": load(waiting=1, tokens=100_000), "b": load(waiting=1, tokens=95_000)}
    shed = decide(loads, 20_000, LIMITS)
    assert isinstance(shed, Shed) and shed.reason is ShedReason.PREFILL_TOKENS
    # "b" drains first: 15,000 tokens over at 1,000 tok/s.
    assert shed.retry_after_s == 15
    assert "15000 over" in shed.message


def test_retry_after_is_clamped() -> None:
    assert retry_after_s(1, LIMITS) == 1
    assert retry_after_s(10**9, LIMITS) == LIMITS.max_retry_after_s
    assert retry_after_s(10**9, LIMITS.model_copy(update={"prefill_tokens_per_s": None})) == LIMITS.retry_after_s


def test_derived_limits_follow_existing_knobs() -> None:
    limits = derive_limits(prefill_concurrency=20, context_limit_tokens=262_144, prefill_tokens_per_s=1409.73)
    assert limits.max_queued_requests == 20
    # 60 s of prefill at 1,410 tok/s is less than one window: the window wins.
    assert limits.max_queued_prefill_tokens == 262_144
    fast = derive_limits(prefill_concurrency=20, context_limit_tokens=32_768, prefill_tokens_per_s=22_000.0)
    assert fast.max_queued_prefill_tokens == 22_000 * 60
    no_rate = derive_limits(prefill_concurrency=4, context_limit_tokens=1000)
    assert no_rate.max_queued_prefill_tokens == 2000 and no_rate.prefill_tokens_per_s is None


def test_limits_are_validated() -> None:
    with pytest.raises(ValidationError, match="max_retry_after_s"):
        BackpressureLimits(retry_after_s=10, max_retry_after_s=5)
    with pytest.raises(ValidationError, match="Extra inputs"):
        BackpressureLimits(max_queue=3)


loads_st = st.builds(
    load,
    waiting=st.integers(0, 12),
    prefilling=st.integers(0, 12),
    decoding=st.integers(0, 12),
    tokens=st.integers(0, 300_000),
)


@settings(deadline=None)  # CI shares 2 cores: a slow example is not a failure
@given(st.dictionaries(st.sampled_from("abcdef"), loads_st, max_size=6), st.integers(1, 300_000))
def test_decide_admits_only_within_limits_and_sheds_only_when_all_are_over(loads, tokens) -> None:
    outcome = decide(loads, tokens, LIMITS)
    if isinstance(outcome, Admit):
        assert outcome.replica_ids
        for rid in outcome.replica_ids:
            ld = loads[rid]
            assert ld.num_pending < LIMITS.max_queued_requests
            assert ld.prefill_tokens == 0 or ld.prefill_tokens + tokens <= LIMITS.max_queued_prefill_tokens
        refused = set(loads) - set(outcome.replica_ids)
        assert all(not assess(loads[r], tokens, LIMITS).admits for r in refused)
    else:
        assert outcome.status == (503 if not loads else 429)
        assert LIMITS.retry_after_s <= outcome.retry_after_s <= LIMITS.max_retry_after_s
        assert all(not assess(ld, tokens, LIMITS).admits for ld in loads.values())


@settings(deadline=None)
@given(loads_st, st.integers(1, 300_000), st.integers(1, 300_000))
def test_a_smaller_request_is_admitted_wherever_a_larger_one_is(ld, a, b) -> None:
    small, large = sorted((a, b))
    if assess(ld, large, LIMITS).admits:
        assert assess(ld, small, LIMITS).admits
