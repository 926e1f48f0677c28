"""The one traffic classifier: its boundary, hysteresis, and the planner's `is_short` agreeing with it."""

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.traffic import TrafficClass, classify
from tests.factories import cfg


def test_the_threshold_itself_is_short() -> None:
    assert classify(2048, 2048) is TrafficClass.SHORT
    assert classify(2049, 2048) is TrafficClass.LONG
    assert cfg(short_request_tokens=100).is_short(100)
    assert not cfg(short_request_tokens=100).is_short(101)


def test_a_long_session_stays_long_down_to_the_hysteresis_bound() -> None:
    assert classify(1500, 2048, TrafficClass.LONG, 0.5) is TrafficClass.LONG
    assert classify(1024, 2048, TrafficClass.LONG, 0.5) is TrafficClass.SHORT
    assert classify(1500, 2048, TrafficClass.SHORT, 0.5) is TrafficClass.SHORT


@settings(deadline=None)  # CI shares 2 cores: time is no part of these properties
@given(uncached=st.integers(1, 300_000), threshold=st.integers(1, 100_000))
def test_planner_and_router_share_one_rule(uncached: int, threshold: int) -> None:
    short = cfg(short_request_tokens=threshold).is_short(uncached)
    assert short == (classify(uncached, threshold) is TrafficClass.SHORT)


@settings(deadline=None)  # CI shares 2 cores: time is no part of these properties
@given(
    uncached=st.integers(1, 300_000),
    threshold=st.integers(1, 100_000),
    hysteresis=st.floats(0, 0.99),
    previous=st.sampled_from([None, TrafficClass.SHORT, TrafficClass.LONG]),
)
def test_hysteresis_only_keeps_long_sessions_long(uncached, threshold, hysteresis, previous) -> None:
    plain = classify(uncached, threshold)
    sticky = classify(uncached, threshold, previous, hysteresis)
    if previous is TrafficClass.LONG:
        assert plain is TrafficClass.SHORT or sticky is TrafficClass.LONG  # never LONG -> SHORT by hysteresis
    else:
        assert sticky is plain
