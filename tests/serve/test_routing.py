"""The lane policy on its own: fake replicas, an injected clock, no Ray."""

from __future__ import annotations

from scheduler.traffic import TrafficClass, classify
from serve_app.config import RoutingKnobs
from serve_app.engine_backend import ReplicaLoad
from serve_app.routing import (
    Lane,
    LanePolicy,
    ReplicaView,
    RouteHint,
    RouteReason,
)

KNOBS = RoutingKnobs(class_hysteresis=0.5, busy_pending_requests=2, busy_prefill_tokens=16384)
T0 = 1000.0


def view(rid: str, lane: Lane, pending: int = 0, prefill: int = 0, sessions=None, stats_time=T0, full=False, **kw):
    load = ReplicaLoad(num_waiting=pending, prefill_tokens=prefill, max_running_requests=10, **kw)
    return ReplicaView(rid, lane, load, stats_time, sessions or {}, full=full)


def hint(session: str | None, tokens: int, **kw) -> RouteHint:
    return RouteHint(session_id=session, prompt_tokens=tokens, knobs=kw.pop("knobs", KNOBS), **kw)


def two_lanes(**loads) -> list[ReplicaView]:
    return [
        view("L", Lane.LONG, **loads.get("L", {})),
        view("C1", Lane.CHAT, **loads.get("C1", {})),
        view("C2", Lane.CHAT, **loads.get("C2", {})),
    ]


def test_classify_with_hysteresis() -> None:
    assert classify(2048, 2048) is TrafficClass.SHORT
    assert classify(2049, 2048) is TrafficClass.LONG
    # A session classed long stays long until its uncached prompt falls below 1024 tokens.
    assert classify(1500, 2048, TrafficClass.LONG, 0.5) is TrafficClass.LONG
    assert classify(1000, 2048, TrafficClass.LONG, 0.5) is TrafficClass.SHORT
    assert classify(1500, 2048, TrafficClass.SHORT, 0.5) is TrafficClass.SHORT


def test_long_goes_to_long_lane_and_short_to_chat_lane() -> None:
    p = LanePolicy()
    d = p.decide("r1", hint("a", 50_000), two_lanes(), T0)
    assert (d.replica_id, d.lane, d.traffic_class, d.reason) == (
        "L",
        Lane.LONG,
        TrafficClass.LONG,
        RouteReason.LEAST_LOADED,
    )
    d = p.decide("r2", hint("b", 30), two_lanes(), T0)
    assert d.lane is Lane.CHAT and d.traffic_class is TrafficClass.SHORT


def test_session_affinity_and_class_from_uncached_work() -> None:
    p = LanePolicy()
    d1 = p.decide("r1", hint("doc", 50_000), two_lanes(), T0)
    p.on_completed("r1", T0 + 1)
    # The follow-up resends the document: uncached only the new question, so a chat, kept where the cache is.
    d2 = p.decide("r2", hint("doc", 50_100), two_lanes(), T0 + 2)
    assert d2.replica_id == d1.replica_id == "L"
    assert (d2.traffic_class, d2.reason, d2.lane, d2.uncached_tokens) == (
        TrafficClass.SHORT,
        RouteReason.AFFINITY,
        Lane.LONG,
        100,
    )


def test_published_cache_overrides_a_stale_estimate() -> None:
    p = LanePolicy()
    p.decide("r1", hint("s", 50_000), two_lanes(), T0)
    p.on_completed("r1", T0 + 1)
    # Stats published after the request finished say the replica evicted the session's cache.
    views = [view("L", Lane.LONG, sessions={}, stats_time=T0 + 5), *two_lanes()[1:]]
    d = p.decide("r2", hint("s", 50_100), views, T0 + 6)
    assert d.traffic_class is TrafficClass.LONG and d.uncached_tokens == 50_100


def test_unknown_session_is_found_where_replicas_say_it_is_cached() -> None:
    p = LanePolicy()
    views = two_lanes()
    views[2] = view("C2", Lane.CHAT, sessions={"s": 900})
    d = p.decide("r1", hint("s", 1000), views, T0)
    assert (d.replica_id, d.reason, d.uncached_tokens) == ("C2", RouteReason.AFFINITY, 100)


def test_busy_pinned_replica_gives_way_within_its_lane() -> None:
    p = LanePolicy()
    assert p.decide("r0", hint("s", 30), two_lanes(), T0).replica_id == "C1"
    p.on_completed("r0", T0)
    d = p.decide("r1", hint("s", 30), two_lanes(C1={"pending": 2}), T0 + 1)
    assert (d.replica_id, d.reason, d.lane) == ("C2", RouteReason.GAVE_WAY, Lane.CHAT)
    # The session now lives on C2.
    p.on_completed("r1", T0 + 1)
    assert p.decide("r2", hint("s", 30), two_lanes(), T0 + 2).replica_id == "C2"


def test_busy_pinned_replica_stays_when_nothing_is_better() -> None:
    p = LanePolicy()
    p.decide("r0", hint("s", 30), two_lanes(), T0)
    d = p.decide("r1", hint("s", 30), two_lanes(C1={"pending": 3}, C2={"pending": 2}, L={"pending": 2}), T0 + 1)
    assert (d.replica_id, d.reason) == ("C1", RouteReason.AFFINITY)


def test_document_followup_never_lands_uncached_in_the_chat_lane() -> None:
    p = LanePolicy()
    p.decide("r0", hint("doc", 50_000), two_lanes(), T0)
    p.on_completed("r0", T0)
    # The long replica is busy for chats, but moving would make the follow-up a 50k-token prefill.
    d = p.decide("r1", hint("doc", 50_050), two_lanes(L={"pending": 5}), T0 + 1)
    assert (d.replica_id, d.reason) == ("L", RouteReason.AFFINITY)


def test_chat_spills_only_when_every_chat_replica_is_busy() -> None:
    p = LanePolicy()
    d = p.decide("r1", hint(None, 30), two_lanes(C1={"pending": 2}, L={"prefill": 90_000, "pending": 1}), T0)
    assert d.replica_id == "C2"
    d = p.decide(
        "r2", hint(None, 30), two_lanes(C1={"pending": 2}, C2={"pending": 3}, L={"prefill": 90_000, "pending": 1}), T0
    )
    assert (d.replica_id, d.lane, d.traffic_class, d.reason) == ("L", Lane.LONG, TrafficClass.SHORT, RouteReason.SPILL)
    no_spill = RoutingKnobs(busy_pending_requests=2, chat_spill=False)
    d = p.decide("r3", hint(None, 30, knobs=no_spill), two_lanes(C1={"pending": 2}, C2={"pending": 3}), T0)
    assert d.replica_id == "C1"


def test_long_documents_never_take_the_chat_lane_unless_there_is_no_long_lane() -> None:
    p = LanePolicy()
    d = p.decide("r1", hint(None, 50_000), two_lanes(L={"prefill": 500_000, "pending": 9}), T0)
    assert d.replica_id == "L"
    chat_only = [view("C1", Lane.CHAT), view("C2", Lane.CHAT, pending=1)]
    d = p.decide("r2", hint(None, 50_000), chat_only, T0)
    assert (d.replica_id, d.lane, d.reason) == ("C1", Lane.CHAT, RouteReason.NO_LANE)


def test_one_replica_serves_both_lanes() -> None:
    p = LanePolicy()
    both = [view("R", Lane.BOTH)]
    assert p.decide("r1", hint(None, 50_000), both, T0).lane is Lane.LONG
    assert p.decide("r2", hint(None, 30), both, T0).lane is Lane.CHAT


def test_recent_sends_count_until_published_and_finished_requests_stop_counting() -> None:
    p = LanePolicy()
    # Two sends in a row to an idle lane: the second sees the first although no stats were published since.
    first = p.decide("r1", hint("a", 1500, request_id="a1"), two_lanes(), T0 + 1)
    second = p.decide("r2", hint("b", 1500, request_id="b1"), two_lanes(), T0 + 1)
    assert {first.replica_id, second.replica_id} == {"C1", "C2"}
    # C1 published its two pending requests; one finished since: it no longer counts.
    p.decide("r3", hint("c", 1500, request_id="c1"), two_lanes(), T0 + 1)
    views = [
        view("L", Lane.LONG, stats_time=T0 + 2),
        ReplicaView(
            "C1", Lane.CHAT, ReplicaLoad(num_waiting=2, prefill_tokens=3000), T0 + 2, pending={"a1": 1500, "c1": 1500}
        ),
        ReplicaView("C2", Lane.CHAT, ReplicaLoad(num_waiting=1, prefill_tokens=1500), T0 + 2, pending={"b1": 1500}),
    ]
    p.on_completed("r1", T0 + 2.1)
    load = p.effective_load(views[1])
    assert (load.num_pending, load.prefill_tokens) == (1, 1500)


def test_full_replicas_are_avoided_and_targets_are_honoured() -> None:
    p = LanePolicy()
    views = [view("C1", Lane.CHAT, full=True), view("C2", Lane.CHAT, pending=1)]
    assert p.decide("r1", hint(None, 30), views, T0).replica_id == "C2"
    d = p.decide("r2", hint(None, 1, target_replica="C1"), views, T0)
    assert (d.replica_id, d.reason) == ("C1", RouteReason.TARGETED)


def test_sessions_expire_and_are_bounded() -> None:
    knobs = RoutingKnobs(session_ttl_s=10, max_sessions=2)
    p = LanePolicy()
    for i in range(3):
        p.decide(f"r{i}", hint(f"s{i}", 30, knobs=knobs), two_lanes(), T0)
    assert p.session_replica("s0") is None and p.session_replica("s2") is not None
    p.decide("r9", hint("x", 30, knobs=knobs), two_lanes(), T0 + 100)
    assert p.session_replica("s2") is None
