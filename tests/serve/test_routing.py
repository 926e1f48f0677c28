"""The lane policy on its own: fake replicas, an injected clock, no Ray."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.traffic import TrafficClass, classify
from serve_app.config import RoutingKnobs
from serve_app.replica.backend import ReplicaLoad
from serve_app.routing.backpressure import BackpressureLimits, Shed, ShedReason, assess
from serve_app.routing.lane_policy import ARRIVAL_MARGIN_S, LanePolicy
from serve_app.routing.prefix_pages import PAGE_TOKENS
from serve_app.routing.records import (
    DEFAULT_SHORT_REQUEST_TOKENS,
    Lane,
    ReplicaView,
    RouteDecision,
    RouteHint,
    RouteReason,
    RouteTicket,
    RoutingStats,
)
from tests.hypothesis_budget import examples
from tests.serve.prefixes import held, pages
from tests.serve.strategies import limits_st

KNOBS = RoutingKnobs(class_hysteresis=0.5, busy_pending_requests=2, busy_prefill_tokens=16384)
T0 = 1000.0


def view(rid: str, lane: Lane, pending: int = 0, prefill: int = 0, cached=None, stats_time=T0, full=False, **kw):
    """`cached`: the prompts the replica published it holds (name -> tokens)."""
    load = ReplicaLoad(num_waiting=pending, prefill_tokens=prefill, max_running_requests=10, **kw)
    return ReplicaView(rid, lane, load, stats_time, held(cached), full=full)


def hint(prompt: str | None, tokens: int, session: str | None = None, **kw) -> RouteHint:
    """A request for the prompt named `prompt` (`tests.serve.prefixes`), naming `session` if given."""
    prefix = pages(prompt, tokens) if prompt else ()
    return RouteHint(session, tokens, prefix, knobs=kw.pop("knobs", KNOBS), **kw)


def page_floor(tokens: int) -> int:
    """The tokens of a prompt's whole pages: what a replica can be known to hold of it."""
    return tokens // PAGE_TOKENS * PAGE_TOKENS


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
    # The follow-up resends the document, with no session id: uncached only the new question (and the document's
    # last partial page), so a chat, kept where the cache is.
    d2 = p.decide("r2", hint("doc", 50_100), two_lanes(), T0 + 2)
    assert d2.replica_id == d1.replica_id == "L"
    assert (d2.traffic_class, d2.reason, d2.lane, d2.uncached_tokens) == (
        TrafficClass.SHORT,
        RouteReason.AFFINITY,
        Lane.LONG,
        50_100 - page_floor(50_000),
    )


def test_published_cache_overrides_a_stale_estimate() -> None:
    p = LanePolicy()
    p.decide("r1", hint("s", 50_000), two_lanes(), T0)
    p.on_completed("r1", T0 + 1)
    # Stats published after the request finished say the replica evicted the document.
    views = [view("L", Lane.LONG, cached={}, stats_time=T0 + 5), *two_lanes()[1:]]
    d = p.decide("r2", hint("s", 50_100), views, T0 + 6)
    assert d.traffic_class is TrafficClass.LONG and d.uncached_tokens == 50_100


def test_a_prompt_this_router_never_sent_is_found_where_replicas_say_it_is_cached() -> None:
    p = LanePolicy()
    views = two_lanes()
    views[2] = view("C2", Lane.CHAT, cached={"s": 900})
    d = p.decide("r1", hint("s", 1000), views, T0)
    assert (d.replica_id, d.reason, d.uncached_tokens) == ("C2", RouteReason.AFFINITY, 1000 - page_floor(900))


def test_busy_pinned_replica_gives_way_within_its_lane() -> None:
    p = LanePolicy()
    assert p.decide("r0", hint("s", 30, session="s"), two_lanes(), T0).replica_id == "C1"
    p.on_completed("r0", T0)
    d = p.decide("r1", hint("s", 30, session="s"), two_lanes(C1={"pending": 2}), T0 + 1)
    assert (d.replica_id, d.reason, d.lane) == ("C2", RouteReason.GAVE_WAY, Lane.CHAT)
    # The session (a short chat: no whole page to match; its name is the hint) now lives on C2.
    p.on_completed("r1", T0 + 1)
    assert p.decide("r2", hint("s", 30, session="s"), two_lanes(), T0 + 2).replica_id == "C2"


def test_busy_pinned_replica_stays_when_nothing_is_better() -> None:
    p = LanePolicy()
    p.decide("r0", hint("s", 30, session="s"), two_lanes(), T0)
    d = p.decide(
        "r1", hint("s", 30, session="s"), two_lanes(C1={"pending": 3}, C2={"pending": 2}, L={"pending": 2}), T0 + 1
    )
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
        p.decide(f"r{i}", hint(f"s{i}", 30, session=f"s{i}", knobs=knobs), two_lanes(), T0)
    assert p.session_replica("s0") is None and p.session_replica("s2") is not None
    p.decide("r9", hint("x", 30, session="x", knobs=knobs), two_lanes(), T0 + 100)
    assert p.session_replica("s2") is None


# -- the load correction: published load + what this router knows happened since ---------------------


def test_a_send_after_publication_counts_as_waiting_with_its_tokens() -> None:
    p = LanePolicy()
    p.decide("r1", hint("a", 1500, request_id="a1"), two_lanes(), T0 + 1)
    published = view("C1", Lane.CHAT, pending=1, prefill=700, stats_time=T0 + 0.5)
    load = p.effective_load(published)
    assert (load.num_waiting, load.num_prefilling, load.prefill_tokens) == (2, 0, 2200)


def test_a_send_just_before_publication_may_not_have_arrived_and_still_counts() -> None:
    p = LanePolicy()
    p.decide("r1", hint("a", 1500, request_id="a1"), two_lanes(), T0)
    inside_margin = view("C1", Lane.CHAT, stats_time=T0 + ARRIVAL_MARGIN_S / 2)
    well_after = view("C1", Lane.CHAT, stats_time=T0 + 2 * ARRIVAL_MARGIN_S)
    assert p.effective_load(inside_margin).num_waiting == 1
    # Published well after the send without it pending: it already had its first token there.
    assert p.effective_load(well_after).num_waiting == 0


def test_a_send_the_replica_already_published_is_not_counted_twice() -> None:
    p = LanePolicy()
    p.decide("r1", hint("a", 1500, request_id="a1"), two_lanes(), T0 + 1)
    published = ReplicaView(
        "C1", Lane.CHAT, ReplicaLoad(num_waiting=1, prefill_tokens=1500), T0 + 1, pending={"a1": 1500}
    )
    load = p.effective_load(published)
    assert (load.num_waiting, load.prefill_tokens) == (1, 1500)


def test_a_finished_pending_request_leaves_prefilling_before_waiting() -> None:
    p = LanePolicy()
    p.decide("r1", hint("a", 1500, request_id="a1"), two_lanes(), T0)
    p.on_completed("r1", T0 + 0.5)
    published = ReplicaView(
        "C1",
        Lane.CHAT,
        ReplicaLoad(num_waiting=1, num_prefilling=1, prefill_tokens=2000),
        T0 + 1,
        pending={"a1": 500, "b1": 1500},
    )
    load = p.effective_load(published)
    assert (load.num_waiting, load.num_prefilling, load.prefill_tokens) == (1, 0, 1500)


def both_idle() -> list[ReplicaView]:
    return [view("R1", Lane.BOTH, stats_time=T0), view("R2", Lane.BOTH, stats_time=T0)]


def test_a_chat_that_ended_after_the_publication_that_counted_it_decoding_counts_no_longer() -> None:
    """A client's chats back to back: the next is sent as soon as the last one's end was read, before its replica
    publishes again. Counted as still decoding there, the replica looked busier than the idle other one."""
    p = LanePolicy()
    first = p.decide("r1", hint("a", 30, request_id="a1"), both_idle(), T0 - 1)
    published = view(first.replica_id, Lane.BOTH, stats_time=T0, num_decoding=1)  # while it decoded
    other = next(v for v in both_idle() if v.replica_id != first.replica_id)
    assert p.effective_load(published).num_decoding == 1
    p.on_completed("r1", T0 + 0.2)
    assert p.effective_load(published).num_decoding == 0
    second = p.decide("r2", hint("b", 30, request_id="b1"), [published, other], T0 + 0.21)
    assert second.replica_id == first.replica_id
    # One that ended before the publication was not in it: the publication's own count stands.
    p.decide("r3", hint("c", 30, request_id="c1"), [published, other], T0 - 1)
    p.on_completed("r3", T0 - 0.5)
    later = view(first.replica_id, Lane.BOTH, stats_time=T0 - 0.4, num_decoding=1)
    assert p.effective_load(later).num_decoding == 1


def test_a_chat_sent_just_before_a_publication_and_ended_after_it_may_not_have_been_counted() -> None:
    p = LanePolicy()
    d = p.decide("r1", hint("a", 30, request_id="a1"), both_idle(), T0 - ARRIVAL_MARGIN_S / 2)
    p.on_completed("r1", T0 + 0.1)
    published = view(d.replica_id, Lane.BOTH, stats_time=T0, num_decoding=1)  # someone else's, maybe
    assert p.effective_load(published).num_decoding == 1


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 2), st.floats(0, 2), st.booleans()), max_size=12),
    st.integers(0, 6),
    st.floats(0, 2),
)
def test_ended_requests_take_at_most_what_the_publication_counted_and_only_their_replicas(
    requests: list[tuple[float, float, bool]], decoding: int, stats_at: float
) -> None:
    """Whatever ended when: the corrected decoding count is never negative, never above the published one, and a
    replica none of whose requests ended keeps its count."""
    p = LanePolicy()
    for i, (sent_at, _, _) in enumerate(requests):
        p.decide(f"r{i}", hint(None, 30, request_id=f"q{i}", target_replica="R1"), both_idle(), T0 + sent_at)
    for i, (sent_at, took, ends) in sorted(enumerate(requests), key=lambda r: r[1][0] + r[1][1]):
        if ends:
            p.on_completed(f"r{i}", T0 + sent_at + took)
    r1, r2 = (view(r, Lane.BOTH, stats_time=T0 + stats_at, num_decoding=decoding) for r in ("R1", "R2"))
    assert 0 <= p.effective_load(r1).num_decoding <= decoding
    assert p.effective_load(r2).num_decoding == decoding


def test_a_busy_bound_is_reached_at_the_bound_itself() -> None:
    p = LanePolicy()
    longs = [view("L1", Lane.LONG), view("L2", Lane.LONG), view("C1", Lane.CHAT)]
    assert p.decide("r0", hint("doc", 50_000), longs, T0).replica_id == "L1"
    p.on_completed("r0", T0)
    # A new 50k document of the session: L1 has exactly busy_prefill_tokens waiting, L2 none.
    at_bound = [view("L1", Lane.LONG, prefill=KNOBS.busy_prefill_tokens), view("L2", Lane.LONG), view("C1", Lane.CHAT)]
    d = p.decide("r1", hint("doc", 120_000), at_bound, T0 + 1)
    assert (d.replica_id, d.reason) == ("L2", RouteReason.GAVE_WAY)


def test_the_engines_published_threshold_decides_the_class() -> None:
    p = LanePolicy()
    # The engines run short_request_tokens=4096: a 3000-token prompt is a chat for them, so for the router too.
    views = [ReplicaView(v.replica_id, v.lane, v.load, T0, short_request_tokens=4096) for v in two_lanes()]
    d = p.decide("r1", hint(None, 3000), views, T0)
    assert (d.traffic_class, d.lane) == (TrafficClass.SHORT, Lane.CHAT)
    views = [ReplicaView(v.replica_id, v.lane, v.load, T0, short_request_tokens=1000) for v in two_lanes()]
    d = p.decide("r2", hint(None, 3000), views, T0)
    assert (d.traffic_class, d.lane) == (TrafficClass.LONG, Lane.LONG)


def test_routing_stats_survive_serve_transport_and_default_before_publication() -> None:
    stats = RoutingStats(Lane.CHAT, ReplicaLoad(num_waiting=3, kv_used_tokens=10), 512, T0, [7, -40], {"r": 9})
    assert RoutingStats.from_dict(stats.to_dict()) == stats
    view_ = ReplicaView.from_stats("C9", stats, full=True)
    assert (view_.lane, view_.short_request_tokens, view_.prefixes, view_.pending, view_.full) == (
        Lane.CHAT,
        512,
        {7, -40},
        {"r": 9},
        True,
    )
    nothing_yet = RoutingStats.from_dict(None, Lane.LONG)
    assert (nothing_yet.lane, nothing_yet.time_s, nothing_yet.load) == (Lane.LONG, 0.0, ReplicaLoad())


def test_a_ticket_carries_the_last_decision() -> None:
    ticket = RouteTicket(hint("s", 30))
    p = LanePolicy()
    first = p.decide("r1", ticket.hint, two_lanes(), T0)
    ticket.record(first, 1.0)
    # Serve retried (the replica was full): the router decides again from the same hint.
    second = p.decide("r1", ticket.hint, two_lanes(C1={"full": True}), T0)
    ticket.record(second, 2.0)
    assert (ticket.decision, ticket.decided_at_s) == (second, 2.0)
    assert second.replica_id != first.replica_id


# -- invariants over random replica sets -----------------------------------------------------------


def views_of(max_waiting: int, **published: st.SearchStrategy) -> st.SearchStrategy[ReplicaView]:
    """Replica views with random lanes and loads; `published`: strategies for further `ReplicaView` fields."""
    return st.builds(
        lambda i, lane, waiting, prefill, decoding, full, **fields: ReplicaView(
            f"R{i}",
            lane,
            ReplicaLoad(num_waiting=waiting, prefill_tokens=prefill, num_decoding=decoding),
            T0,
            full=full,
            **fields,
        ),
        st.integers(0, 50),
        st.sampled_from(list(Lane)),
        st.integers(0, max_waiting),
        st.integers(0, 200_000),
        st.integers(0, 8),
        st.booleans(),
        **published,
    )


replica_views = views_of(8, short_request_tokens=st.sampled_from([512, 2048, 8192]))


@settings(deadline=None, max_examples=examples(200))
@given(
    views=st.lists(replica_views, min_size=1, max_size=6, unique_by=lambda v: v.replica_id),
    requests=st.lists(st.tuples(st.sampled_from([None, "s1", "s2"]), st.integers(1, 150_000)), min_size=1, max_size=6),
    chat_spill=st.booleans(),
)
def test_every_decision_respects_lanes_and_limits(views, requests, chat_spill) -> None:
    knobs = RoutingKnobs(busy_pending_requests=2, busy_prefill_tokens=16384, chat_spill=chat_spill)
    p = LanePolicy()
    by_id = {v.replica_id: v for v in views}
    usable = [v for v in views if not v.full] or views
    for i, (session, tokens) in enumerate(requests):
        d = p.decide(f"r{i}", hint(session, tokens, knobs=knobs), views, T0 + i)
        chosen = by_id[d.replica_id]
        assert chosen in usable  # a full replica only when every replica is full
        assert d.lane is not Lane.BOTH
        assert d.lane is chosen.lane or chosen.lane is Lane.BOTH
        assert 1 <= d.uncached_tokens <= max(1, tokens)
        has_long_lane = any(v.lane is not Lane.CHAT for v in usable)
        if d.traffic_class is TrafficClass.LONG and has_long_lane:
            assert d.lane is Lane.LONG  # a document never lands in the chat lane while a long lane exists
        if d.lane is Lane.LONG and d.traffic_class is TrafficClass.SHORT and d.reason is RouteReason.SPILL:
            assert chat_spill


def test_replicas_mid_change_classify_with_the_threshold_most_publish() -> None:
    # A live change reached one chat replica (threshold 512) but not the others (2048) yet.
    views = [
        ReplicaView("L", Lane.LONG, ReplicaLoad(), T0, short_request_tokens=2048),
        ReplicaView("C1", Lane.CHAT, ReplicaLoad(), T0, short_request_tokens=512),
        ReplicaView("C2", Lane.CHAT, ReplicaLoad(num_waiting=1), T0, short_request_tokens=2048),
    ]
    d = LanePolicy().decide("r1", hint(None, 1000), views, T0)
    assert (d.traffic_class, d.lane, d.reason) == (TrafficClass.SHORT, Lane.CHAT, RouteReason.LEAST_LOADED)


# -- backpressure limits (rule 5) -------------------------------------------------------------------

LIMITS = BackpressureLimits(max_queued_requests=2, max_queued_prefill_tokens=60_000)


def limited(views: list[ReplicaView], limits: BackpressureLimits = LIMITS) -> list[ReplicaView]:
    return [replace(v, limits=limits) for v in views]


def test_a_replica_over_its_token_limit_is_skipped_for_one_under_it() -> None:
    # C1 has fewer requests waiting (least loaded by rule 4) but a document's worth of tokens queued.
    views = limited(two_lanes(C1={"pending": 1, "prefill": 59_000}, C2={"pending": 1, "num_decoding": 3}))
    d = LanePolicy().decide("r1", hint(None, 1500), views, T0)
    assert (d.replica_id, d.reason) == ("C2", RouteReason.LEAST_LOADED)


def test_affinity_gives_way_to_the_limit_as_it_does_to_load() -> None:
    knobs = RoutingKnobs(busy_pending_requests=5)  # one waiting request is not busy for the load bound
    p = LanePolicy()
    assert p.decide("r0", hint("s", 30, session="s", knobs=knobs), limited(two_lanes()), T0).replica_id == "C1"
    p.on_completed("r0", T0)
    at_limit = limited(two_lanes(C1={"pending": 2}), LIMITS)  # max_queued_requests reached
    d = p.decide("r1", hint("s", 60, session="s", knobs=knobs), at_limit, T0 + 1)
    assert (d.replica_id, d.reason) == ("C2", RouteReason.GAVE_WAY)
    # Under the limit again, with the same one waiting request, the session stays.
    p.on_completed("r1", T0 + 1)
    d = p.decide("r2", hint("s", 90, session="s", knobs=knobs), limited(two_lanes(C2={"pending": 1})), T0 + 2)
    assert (d.replica_id, d.reason) == ("C2", RouteReason.AFFINITY)


def test_chats_spill_to_the_long_lane_when_every_chat_replica_is_over_a_limit() -> None:
    views = limited(two_lanes(C1={"pending": 2}, C2={"pending": 2}))
    d = LanePolicy().decide("r1", hint(None, 30, knobs=RoutingKnobs(busy_pending_requests=5)), views, T0)
    assert (d.replica_id, d.lane, d.reason) == ("L", Lane.LONG, RouteReason.SPILL)
    no_spill = RoutingKnobs(busy_pending_requests=5, chat_spill=False)
    shed = LanePolicy().decide("r2", hint(None, 30, knobs=no_spill), views, T0)
    assert isinstance(shed, Shed) and shed.reason is ShedReason.QUEUED


def test_a_document_is_shed_when_the_long_lane_is_over_even_with_chat_replicas_free() -> None:
    views = limited(two_lanes(L={"pending": 1, "prefill": 50_000}))
    shed = LanePolicy().decide("r1", hint(None, 40_000), views, T0)
    assert isinstance(shed, Shed)
    assert (shed.status, shed.reason, shed.error().headers) == (429, ShedReason.PREFILL_TOKENS, {"Retry-After": "1"})
    assert shed.error().body()["error"]["code"] == "rate_limit_exceeded"


def test_a_burst_between_publications_is_spread_but_never_shed_on_the_routers_own_estimate() -> None:
    # Both chat replicas published idle. The router's own sends since spread the burst (rule 4 on corrected loads),
    # but shedding waits for a replica to publish that it is over a limit: the correction counts every request sent
    # since as still waiting for its first token, which under a high request rate is mostly false.
    p = LanePolicy()
    views = limited(two_lanes(), LIMITS)
    knobs = RoutingKnobs(busy_pending_requests=10)
    outcomes = [p.decide(f"r{i}", hint(None, 30, knobs=knobs, request_id=f"q{i}"), views, T0) for i in range(7)]
    assert all(isinstance(d, RouteDecision) for d in outcomes)
    chosen = Counter(d.replica_id for d in outcomes)
    assert chosen["C1"] + chosen["C2"] == 7 and abs(chosen["C1"] - chosen["C2"]) <= 1  # spread, chat lane kept
    assert p.effective_load(views[1]).num_pending == chosen[views[1].replica_id]


def test_a_replica_that_published_it_is_over_a_limit_is_skipped_then_shed() -> None:
    full = {"pending": LIMITS.max_queued_requests}
    p = LanePolicy()
    d = p.decide("r1", hint(None, 30), limited(two_lanes(C1=full)), T0)
    assert isinstance(d, RouteDecision) and d.replica_id == "C2"
    d = p.decide("r2", hint(None, 30), limited(two_lanes(L=full, C1=full, C2=full)), T0)
    assert isinstance(d, Shed) and d.status == 429


def test_the_in_flight_limit_is_left_to_serve() -> None:
    # Every replica has many requests decoding: whether one is full is Serve's own count (its queue holds the request).
    busy = {"num_decoding": 64}
    d = LanePolicy().decide("r1", hint(None, 30), limited(two_lanes(L=busy, C1=busy, C2=busy)), T0)
    assert isinstance(d, RouteDecision) and d.lane is Lane.CHAT


def test_replicas_without_published_limits_are_taken_to_admit() -> None:
    views = [*limited(two_lanes(C1={"pending": 2}))[:2], view("C2", Lane.CHAT, pending=9)]
    d = LanePolicy().decide("r1", hint(None, 30, knobs=RoutingKnobs(busy_pending_requests=20)), views, T0)
    assert d.replica_id == "C2"


def test_published_limits_survive_serve_transport() -> None:
    stats = RoutingStats(Lane.CHAT, ReplicaLoad(num_waiting=1), 512, T0, limits=LIMITS)
    parsed = RoutingStats.from_dict(stats.to_dict())
    assert parsed == stats and ReplicaView.from_stats("C1", parsed).limits == LIMITS


def test_limits_published_by_another_version_still_parse() -> None:
    # A rolling update: a replica of the previous version still publishes the in-flight limit, now Serve's alone.
    published = RoutingStats(Lane.CHAT, ReplicaLoad(num_waiting=1), 512, T0, limits=LIMITS).to_dict()
    published["limits"] = {**published["limits"], "max_ongoing_requests": 8}
    assert RoutingStats.from_dict(published).limits == LIMITS


limited_views = views_of(6, limits=limits_st)


def over_limit(load: ReplicaLoad, v: ReplicaView, tokens: int) -> bool:
    """Over a limit the router enforces (in-flight requests are Serve's: `full`)."""
    return v.limits is not None and not assess(load, tokens, v.limits).admits


@settings(deadline=None, max_examples=examples(300))
@given(
    views=st.lists(limited_views, min_size=1, max_size=6, unique_by=lambda v: v.replica_id),
    requests=st.lists(st.tuples(st.sampled_from([None, "s1", "s2"]), st.integers(1, 150_000)), min_size=1, max_size=8),
    chat_spill=st.booleans(),
)
def test_never_an_over_limit_replica_and_shed_only_when_every_allowed_one_is_over(views, requests, chat_spill) -> None:
    knobs = RoutingKnobs(busy_pending_requests=2, busy_prefill_tokens=16384, chat_spill=chat_spill)
    p = LanePolicy()
    by_id = {v.replica_id: v for v in views}
    usable = [v for v in views if not v.full] or views
    for i, (session, tokens) in enumerate(requests):
        loads = {v.replica_id: v.load for v in views}  # what the replicas published (the router sheds on that)
        d = p.decide(f"r{i}", hint(session, tokens, knobs=knobs), views, T0 + i)
        if isinstance(d, RouteDecision):
            assert not over_limit(loads[d.replica_id], by_id[d.replica_id], d.uncached_tokens)
            continue
        assert isinstance(d, Shed) and d.status == 429
        if session is not None:
            continue  # the class (and so the lanes allowed) depends on each replica's cache of the session
        # Without a session the class is the same everywhere; which lanes it may use follows rule 2 alone.
        is_long = classify(tokens, DEFAULT_SHORT_REQUEST_TOKENS) is TrafficClass.LONG
        own = Lane.CHAT if is_long else Lane.LONG  # the lane the class may not use (chats: unless spilling)
        allowed = [v for v in usable if v.lane is not own] or usable
        if not is_long and chat_spill:
            allowed = usable  # every chat replica over its limit is busy: the long lane takes a spill
        assert all(over_limit(loads[v.replica_id], v, tokens) for v in allowed)
