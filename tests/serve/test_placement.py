"""Lanes that follow the load: placement by predicted TTFT on replicas that serve both classes. Fake replica
views, an injected clock, no Ray. The static-lane rules are in test_routing."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.config import PolicyConfig
from scheduler.slo import SloTargets
from scheduler.traffic import TrafficClass
from serve_app.config import EngineKnobs, RoutingKnobs
from serve_app.engines.sglang.load_snapshot import EngineReading, PendingPrefill, PrefillRate, replica_load
from serve_app.replica.backend import ReplicaLoad
from serve_app.replica.engine_replica import lane_for
from serve_app.routing.backpressure import Shed, assess
from serve_app.routing.lane_policy import LanePolicy
from serve_app.routing.prefix_pages import PAGE_TOKENS
from serve_app.routing.records import Lane, ReplicaView, RouteDecision, RouteHint, RouteReason, RoutingStats
from serve_app.routing.ttft_prediction import (
    overtakes_queued_prefill,
    predict_ttft_s,
    prefill_drain_s,
    wait_pass_seconds,
    wait_pass_tokens,
    with_request,
)
from tests.hypothesis_budget import examples
from tests.serve.prefixes import held, pages
from tests.serve.strategies import limits_st, loads_st

T0 = 1000.0
RATE = 10_000.0  # tokens/s: a 2048-token pass 0.2 s, a 12,000-token document 1.2 s
KNOBS = RoutingKnobs(busy_pending_requests=8, busy_prefill_tokens=1_000_000)


def load(prefill: int = 0, *, short_first: bool = True, pending: int | None = None, **kw) -> ReplicaLoad:
    waiting = (1 if prefill else 0) if pending is None else pending
    figures = dict(prefill_tok_per_s=RATE, pass_fixed_s=0.01, pass_tokens=2048, short_first=short_first)
    return ReplicaLoad(num_waiting=waiting, prefill_tokens=prefill, **{**figures, **kw})


def view(rid: str, ld: ReplicaLoad, cached=None, lane: Lane = Lane.BOTH, **kw) -> ReplicaView:
    """`cached`: the prompts the replica published it holds (name -> tokens)."""
    return ReplicaView(rid, lane, ld, T0, held(cached), **{"short_request_tokens": 256, **kw})


def hint(prompt: str | None, tokens: int, session: str | None = None) -> RouteHint:
    """A request for the prompt named `prompt` (`tests.serve.prefixes`), naming `session` if given."""
    return RouteHint(session, tokens, pages(prompt, tokens) if prompt else (), knobs=KNOBS)


# -- the prediction ---------------------------------------------------------------------------------------------


def test_prediction_is_none_without_a_rate_and_one_pass_when_idle() -> None:
    assert predict_ttft_s(ReplicaLoad(prefill_tokens=5000), 30) is None
    assert predict_ttft_s(load(), 1000) == 0.01 + 1000 / RATE


def test_a_short_first_engine_makes_a_chat_wait_one_pass_and_upstream_every_queued_token() -> None:
    queued = 12_000
    fair = predict_ttft_s(load(queued), 50)
    assert fair == (0.01 + 2048 / RATE) + (0.01 + 50 / RATE)
    fcfs = predict_ttft_s(load(queued, short_first=False), 50)
    assert fcfs == queued / RATE + 6 * 0.01 + (0.01 + 50 / RATE)  # six passes of 2048 drain 12,000 tokens
    assert prefill_drain_s(load(queued), 500) == 12_500 / RATE + 7 * 0.01


def test_an_engine_that_sizes_passes_in_seconds_bounds_the_wait_for_the_pass_in_flight() -> None:
    slow = dict(prefill_tok_per_s=4000.0)  # a 2048-token pass 0.52 s
    assert predict_ttft_s(load(12_000, **slow), 50) == (0.01 + 2048 / 4000) + (0.01 + 50 / 4000)
    assert predict_ttft_s(load(12_000, wait_pass_s=0.25, **slow), 50) == 0.25 + (0.01 + 50 / 4000)
    assert predict_ttft_s(load(12_000, wait_pass_s=0.25, short_first=False, **slow), 50) > 3.0  # upstream: in order
    policy = PolicyConfig()
    assert wait_pass_seconds(policy) == policy.ttft_target_s / 2
    assert wait_pass_seconds(policy.model_copy(update={"slo_sizing": False})) == 0.0


def test_documents_spread_where_the_engines_bound_a_chats_wait_and_gather_where_they_do_not() -> None:
    # R1 prefills a document. Its chunk passes (0.52 s) would make a chat wait past the target there: the next
    # document joins it, leaving R2 to chats. An engine that sizes passes in seconds keeps a chat's wait within the
    # target beside a document: the next document takes the idle replica.
    slow = dict(prefill_tok_per_s=4000.0)
    for wait_s, chosen in ((0.0, "R1"), (0.25, "R2")):
        views = [view("R1", load(12_000, wait_pass_s=wait_s, **slow)), view("R2", load(wait_pass_s=wait_s, **slow))]
        assert LanePolicy().decide("d", hint("doc", 12_000), views, T0).replica_id == chosen


def test_fresh_engines_spread_the_first_documents_and_a_fresh_one_gets_its_peers_rate() -> None:
    # sglang engines that have prefilled nothing, as they publish their load (no rate measured, the plugin's wait
    # bound 0 before its fit): the first two documents go one to each replica (by counts), not both to one while the
    # other is kept free for chats on a guessed rate.
    fresh = replica_load([], PrefillRate(), 0.0, PolicyConfig(), 2048, plugin_states=[{"wait_pass_s": 0.0}])
    views = [view("R1", fresh), view("R2", fresh)]
    p = LanePolicy()
    first = p.decide("d1", hint("doc1", 12_000), views, T0).replica_id
    second = p.decide("d2", hint("doc2", 12_000), views, T0 + 0.01).replica_id
    assert {first, second} == {"R1", "R2"}
    # A fresh replica beside one that measured is placed at the measured rate: a document that would make a chat
    # wait past the target beside the measured replica's document goes to the fresh one, and chats go where a
    # chat is predicted sooner.
    measured = view("R1", load(12_000, prefill_tok_per_s=4000.0, wait_pass_s=0.25))
    views = [measured, view("R2", fresh)]
    assert LanePolicy().decide("d3", hint("doc3", 12_000), views, T0).replica_id == "R2"
    assert LanePolicy().decide("c", hint("chat", 40), views, T0).replica_id == "R2"


def test_the_chat_a_document_leaves_room_for_is_the_p99_of_the_chats_routed_lately() -> None:
    # The engines' class bound is 2,048 tokens; R1 prefills a document with chunk passes (0.35 s). A chat of the
    # bound's size would miss the target even on an idle replica beside a new document, one of 100 tokens would not.
    slow = dict(prefill_tok_per_s=6000.0)
    views = [
        view("R1", load(12_000, **slow), short_request_tokens=2048),
        view("R2", load(**slow), short_request_tokens=2048),
    ]
    p = LanePolicy()
    for i in range(5):  # chats of 1,500 uncached tokens: a chat beside a document would miss anywhere
        p.decide(f"big{i}", hint(f"c{i}", 1500), views, T0 + i)
        p.on_completed(f"big{i}", T0 + i + 0.5)
    assert p.decide("d1", hint("doc1", 12_000), views, T0 + 5).replica_id == "R1"
    for i in range(100):  # the window moves on to chats of 100 tokens
        p.decide(f"small{i}", hint(f"s{i}", 100), views, T0 + 6 + i)
        p.on_completed(f"small{i}", T0 + 6 + i + 0.5)
    assert p.decide("d2", hint("doc2", 12_000), views, T0 + 200).replica_id == "R2"


@settings(deadline=None, max_examples=examples(300))
@given(ld=loads_st, tokens=st.integers(1, 50_000), more=st.integers(0, 50_000))
def test_the_prediction_never_falls_as_work_is_added(ld: ReplicaLoad, tokens: int, more: int) -> None:
    base = predict_ttft_s(ld, tokens)
    assert base is not None and base > 0
    assert predict_ttft_s(ld, tokens + more) >= base  # a longer prompt
    assert predict_ttft_s(with_request(ld, more), tokens) >= base  # more queued before it
    assert predict_ttft_s(replace(ld, short_first=False), tokens) >= base  # no overtaking


def test_both_backends_publish_the_same_figures_for_the_same_policy() -> None:
    ours, upstream = PolicyConfig(), PolicyConfig(fair_share=False, adaptive_pass=False, skip_ahead=False)
    assert overtakes_queued_prefill(ours) and not overtakes_queued_prefill(upstream)
    assert wait_pass_tokens(ours, 2048) == wait_pass_tokens(upstream, 2048) == 2048
    assert wait_pass_tokens(ours.with_overrides(quiet_pass_tokens=1024), 2048) == 1024


def test_the_prefill_rate_is_none_until_measured_then_the_windows_rate() -> None:
    rate = PrefillRate(window_s=10.0, min_tokens=2048)
    rate.observe(0.0, 0, 0)
    rate.observe(1.0, 1000, 100_000)  # too little prefilled to measure
    assert rate.tok_per_s == 0.0
    rate.observe(2.0, 5000, 1_000_000)  # 5,000 tokens in 1 s of prefill work
    assert rate.tok_per_s == 5000.0
    rate.observe(30.0, 5000, 1_000_000)  # idle since: what was measured stands
    assert rate.tok_per_s == 5000.0
    rate.observe(31.0, 25_000, 3_000_000)  # the window now holds only the last 20,000 tokens in 2 s
    assert rate.tok_per_s == 10_000.0
    rate.observe(32.0, 10, 10)  # a restarted engine's counters start again
    assert rate.tok_per_s == 10_000.0


def test_sglang_load_snapshots_make_the_published_load() -> None:
    def snap(total_tokens: int, busy_us: int) -> SimpleNamespace:
        return SimpleNamespace(
            num_waiting_reqs=1,
            num_running_reqs=2,
            num_waiting_uncached_tokens=9000,
            max_running_requests=8,
            num_used_tokens=100,
            max_total_num_tokens=65_536,
            total_prefill_uncached_tokens=total_tokens,
            total_prefill_busy_us=busy_us,
        )

    rate = PrefillRate()
    policy = PolicyConfig()
    first = replica_load([snap(0, 0)], rate, 0.0, policy, 2048)
    assert (first.prefill_tok_per_s, first.prefill_tokens, first.num_decoding) == (0.0, 9000, 2)
    ld = replica_load([snap(8000, 2_000_000)], rate, 1.0, policy, 2048)
    assert (ld.prefill_tok_per_s, ld.pass_tokens, ld.interactive_pass_tokens, ld.short_first) == (
        4000.0,
        2048,
        512,
        True,
    )
    assert ld.ready and ld.pass_fixed_s == 0.0
    # A document sglang is prefilling in chunks is in no snapshot count: the replica's own record adds it.
    pending = PendingPrefill()
    pending.sent("doc", 12_000)
    pending.sent("chat", 40)
    ld = replica_load([snap(8000, 2_000_000)], rate, 2.0, policy, 2048, pending)
    assert (ld.num_waiting, ld.num_prefilling, ld.num_decoding, ld.prefill_tokens) == (1, 1, 1, 12_040)
    pending.answered("doc")
    assert pending.ids(8) == {"chat": 40}


def queue_snapshot(waiting: int, running: int, queued_tokens: int) -> SimpleNamespace:
    """An sglang scheduler's load snapshot with `waiting` requests (`queued_tokens` uncached) in its queue."""
    return SimpleNamespace(
        num_waiting_reqs=waiting,
        num_running_reqs=running,
        num_waiting_uncached_tokens=queued_tokens,
        max_running_requests=8,
        num_used_tokens=0,
        max_total_num_tokens=65_536,
        total_prefill_uncached_tokens=0,
        total_prefill_busy_us=0,
    )


def test_a_reading_taken_while_a_chat_waited_stops_counting_it_once_the_replica_has_answered_it() -> None:
    reading = EngineReading()
    reading.sent("chat", 40)
    assert reading.read([queue_snapshot(1, 0, 40)], 0.0, PolicyConfig(), 2048, []).num_pending == 1
    # Its first output came before the engine was read again: nothing is pending, nothing is queued.
    after = reading.answered("chat")
    assert after is not None
    assert (after.num_waiting, after.num_prefilling, after.prefill_tokens) == (0, 0, 0)


@settings(deadline=None, max_examples=examples(300))
@given(
    waiting=st.integers(0, 8),
    running=st.integers(0, 8),
    queued_tokens=st.integers(0, 50_000),
    pending=st.lists(st.integers(1, 20_000), max_size=8),
)
def test_the_published_pending_requests_are_the_replicas_own_whatever_the_last_reading(
    waiting: int, running: int, queued_tokens: int, pending: list[int]
) -> None:
    """The engine's queue holds only requests the replica sent and has not seen answered, so a reading never adds a
    pending request to the replica's record, nor takes one away; the record's tokens are a floor."""
    reading = EngineReading()
    queued_tokens = queued_tokens if waiting else 0  # an empty queue holds no tokens
    reading.read([queue_snapshot(waiting, running, queued_tokens)], 0.0, PolicyConfig(), 2048, [])
    load = None
    for i, tokens in enumerate(pending):
        load = reading.sent(f"r{i}", tokens)
    load = load or reading.recount()
    assert load is not None
    assert load.num_pending == len(pending)
    assert load.prefill_tokens >= sum(pending)
    if not pending:
        assert load.prefill_tokens == 0


def test_published_figures_survive_serve_transport() -> None:
    stats = RoutingStats(Lane.BOTH, load(5000, ready=False), 256, T0, interactive_slo=SloTargets(0.4, 0.3))
    assert RoutingStats.from_dict(stats.to_dict()) == stats
    assert RoutingStats.from_dict({}).load.ready  # a replica that published nothing yet is up (Serve added it)


# -- placement --------------------------------------------------------------------------------------------------


def test_lanes_follow_the_load_by_default_and_a_knob_restores_static_lanes() -> None:
    assert EngineKnobs().long_lane_replicas is None
    assert {lane_for(r, 4, None) for r in range(4)} == {Lane.BOTH}
    assert [lane_for(r, 3, 1) for r in range(3)] == [Lane.LONG, Lane.CHAT, Lane.CHAT]


def test_a_chat_goes_where_its_predicted_ttft_is_lowest() -> None:
    # R1 has little queued but its engine serves queued prefill first; on R2 and R3 a chat waits for the pass in
    # flight, R2's a short one (it has 1,000 tokens left), R3's a whole 2048-token pass.
    views = [view("R1", load(3_000, short_first=False)), view("R2", load(1_000)), view("R3", load(20_000))]
    d = LanePolicy().decide("q", hint(None, 40), views, T0)
    assert (d.replica_id, d.traffic_class, d.lane) == ("R2", TrafficClass.SHORT, Lane.CHAT)
    # Without R2, the replica with the most queued is the soonest: one pass there, all 3,000 tokens on R1.
    d = LanePolicy().decide("q", hint(None, 40), [views[0], views[2]], T0)
    assert d.replica_id == "R3"


def test_static_chat_replicas_past_the_target_let_chats_spill_to_an_idle_long_lane() -> None:
    # Few requests wait on either chat replica (under the count bound), but each serves 8,000 queued tokens first.
    behind = load(8_000, short_first=False)
    views = [view("L", load(), lane=Lane.LONG), view("C1", behind, lane=Lane.CHAT), view("C2", behind, lane=Lane.CHAT)]
    d = LanePolicy().decide("q", hint(None, 40), views, T0)
    assert (d.replica_id, d.reason) == ("L", RouteReason.SPILL)


def test_documents_use_every_replica_while_chats_keep_their_slo() -> None:
    p = LanePolicy()
    views = [view("R1", load()), view("R2", load())]
    d1 = p.decide("d1", hint("doc1", 12_000), views, T0)
    views = [view(v.replica_id, load(12_000) if v.replica_id == d1.replica_id else load()) for v in views]
    d2 = p.decide("d2", hint("doc2", 12_000), views, T0)
    assert {d1.replica_id, d2.replica_id} == {"R1", "R2"}  # one pass of 2048 + a chat's own: within 0.5 s
    assert d1.lane is d2.lane is Lane.LONG
    busy = [view("R1", load(12_000)), view("R2", load(12_000))]
    assert p.decide("q", hint(None, 40), busy, T0).traffic_class is TrafficClass.SHORT


def test_a_long_lane_is_reserved_only_when_the_slo_needs_it() -> None:
    # Upstream's order: a chat behind a document waits for all of it, so one replica stays free of documents.
    p = LanePolicy()
    views = [view("R1", load(12_000, short_first=False)), view("R2", load(short_first=False))]
    d = p.decide("d2", hint("doc2", 12_000), views, T0)
    assert d.replica_id == "R1"
    assert p.decide("q", hint(None, 40), views, T0).replica_id == "R2"
    # A pass too slow for the target (a 2048-token pass at 3,000 tokens/s): documents keep off one replica too.
    slow = [view("R1", load(12_000, prefill_tok_per_s=3000.0)), view("R2", load(prefill_tok_per_s=3000.0))]
    assert p.decide("d3", hint("doc3", 12_000), slow, T0).replica_id == "R1"
    # The same replicas under a looser target published by their engines: documents spread again.
    loose = [replace(v, interactive_slo=SloTargets(ttft_s=1.0)) for v in slow]
    assert p.decide("d4", hint("doc4", 12_000), loose, T0).replica_id == "R2"


def test_a_document_followup_keeps_its_cache_unless_elsewhere_is_sooner() -> None:
    p = LanePolicy()
    cached = {"doc": 12_000}
    # R1 holds the document and prefills another; R2 is idle but would prefill the whole document again.
    views = [view("R1", load(10_000), cached=cached), view("R2", load())]
    d = p.decide("f", hint("doc", 12_050), views, T0)
    assert (d.replica_id, d.reason, d.traffic_class, d.uncached_tokens) == (
        "R1",
        RouteReason.AFFINITY,
        TrafficClass.SHORT,
        12_050 - 12_000 // PAGE_TOKENS * PAGE_TOKENS,
    )
    # Behind 60,000 queued tokens served in order, the whole document elsewhere is sooner: it moves.
    views = [view("R1", load(60_000, short_first=False), cached=cached), view("R2", load())]
    d = p.decide("f2", hint("doc", 12_100), views, T0 + 1)
    assert (d.replica_id, d.reason, d.traffic_class) == ("R2", RouteReason.GAVE_WAY, TrafficClass.LONG)


def test_a_chat_session_keeps_its_cache_within_the_target_and_leaves_it_past_the_target() -> None:
    p = LanePolicy()
    assert (
        p.decide(
            "c1", hint("chat", 40, session="chat"), [view("R1", load()), view("R2", load(pending=1))], T0
        ).replica_id
        == "R1"
    )
    p.on_completed("c1", T0 + 1)
    # A document arrived on R1: a chat there waits one pass, within the target, on R2 none. It stays with its cache.
    views = [view("R1", load(12_000), cached={"chat": 60}), view("R2", load())]
    assert predict_ttft_s(views[0].load, 40) <= views[0].ttft_target_s
    d = p.decide("c2", hint("chat", 100, session="chat"), views, T0 + 2)
    assert (d.replica_id, d.reason) == ("R1", RouteReason.AFFINITY)
    p.on_completed("c2", T0 + 2.5)
    # R1's engine serves its document first: the chat's first token there is past the target. It leaves.
    views = [view("R1", load(12_000, short_first=False), cached={"chat": 100}), view("R2", load())]
    assert predict_ttft_s(views[0].load, 40) > views[0].ttft_target_s
    d = p.decide("c2a", hint("chat", 120, session="chat"), views, T0 + 3)
    assert (d.replica_id, d.reason) == ("R2", RouteReason.GAVE_WAY)
    # With nothing queued where it is, it stays, even where a stale load still shows its last turn decoding.
    p.on_completed("c2", T0 + 3)
    views = [view("R1", load()), view("R2", load(pending=0, num_decoding=1), cached={"chat": 100})]
    d = p.decide("c2b", hint("chat", 140, session="chat"), views, T0 + 3.5)
    assert (d.replica_id, d.reason) == ("R2", RouteReason.AFFINITY)
    # Where its cache makes it sooner, it stays.
    p.on_completed("c2", T0 + 3)
    views = [view("R1", load(), cached={"chat": 60}), view("R2", load(), cached={"chat": 5000})]
    d = p.decide("c3", hint("chat", 5040, session="chat"), views, T0 + 4)
    assert (d.replica_id, d.reason) == ("R2", RouteReason.AFFINITY)


def test_a_loading_replica_gets_nothing_and_placement_recovers_when_it_is_up() -> None:
    p = LanePolicy()
    loading = load(ready=False)
    assert p.decide("x", hint(None, 40), [view("R1", loading), view("R2", loading)], T0) is None
    # Only R2 is up: a document and a chat both land there, the chat session pinned.
    views = [view("R1", loading), view("R2", load())]
    assert p.decide("d", hint("doc", 12_000), views, T0).replica_id == "R2"
    assert p.decide("c1", hint("chat", 40, session="chat"), views, T0).replica_id == "R2"
    p.on_completed("c1", T0 + 1)
    # R1 is up. R2's engine serves its queued document first: the chat session leaves for R1 ...
    views = [view("R1", load(short_first=False)), view("R2", load(12_000, short_first=False))]
    d = p.decide("c2", hint("chat", 90, session="chat"), views, T0 + 2)
    assert (d.replica_id, d.reason) == ("R1", RouteReason.GAVE_WAY)
    # ... and the next document joins the first, keeping R1 for chats.
    assert p.decide("d2", hint("doc2", 12_000), views, T0 + 2).replica_id == "R2"


def test_an_added_replica_takes_whatever_role_the_load_needs() -> None:
    p = LanePolicy()
    views = [view("R1", load(12_000)), view("R2", load(12_000))]
    added = view("R3", load())  # the autoscaler's new replica: idle, lane BOTH
    assert p.decide("q", hint(None, 40), [*views, added], T0).replica_id == "R3"
    assert p.decide("d", hint("doc", 12_000), [*views, replace(added, load=load(pending=1))], T0).replica_id == "R3"


# -- invariants over random replica sets ------------------------------------------------------------------------

views_st = st.builds(
    lambda i, lane, ld, ready, full, limits, target, cached: ReplicaView(
        f"R{i}",
        lane,
        replace(ld, ready=ready),
        T0,
        {"s1": cached},
        full=full,
        short_request_tokens=2048,
        limits=limits,
        interactive_slo=SloTargets(ttft_s=target),
    ),
    st.integers(0, 30),
    st.sampled_from([Lane.BOTH, Lane.BOTH, Lane.LONG, Lane.CHAT]),
    st.one_of(loads_st, st.builds(ReplicaLoad, num_waiting=st.integers(0, 8), prefill_tokens=st.integers(0, 99_999))),
    st.booleans(),
    st.booleans(),
    limits_st,
    st.sampled_from([0.1, 0.5, 2.0]),
    st.integers(0, 20_000),
)


@settings(deadline=None, max_examples=examples(400))
@given(
    views=st.lists(views_st, min_size=1, max_size=6, unique_by=lambda v: v.replica_id),
    requests=st.lists(st.tuples(st.sampled_from([None, "s1", "s2"]), st.integers(1, 150_000)), min_size=1, max_size=8),
)
def test_a_replica_its_published_load_puts_over_a_limit_or_loading_never_gets_a_request(views, requests) -> None:
    p = LanePolicy()
    by_id = {v.replica_id: v for v in views}
    for i, (session, tokens) in enumerate(requests):
        d = p.decide(f"r{i}", hint(session, tokens), views, T0 + i)
        if not any(v.load.ready for v in views):
            assert d is None
            continue
        if isinstance(d, Shed):
            assert d.status == 429
            continue
        assert isinstance(d, RouteDecision)
        chosen = by_id[d.replica_id]
        assert chosen.load.ready
        limits = chosen.limits
        assert limits is None or assess(chosen.load, d.uncached_tokens, limits).admits
        assert not chosen.full or all(v.full for v in views if v.load.ready)


def test_a_replica_running_this_routers_chat_is_predicted_on_interactive_passes() -> None:
    p = LanePolicy()
    ld = load(12_000, interactive_pass_tokens=512)
    views = [view("R1", ld)]
    p.decide("c", hint(None, 40), views, T0)
    quiet_pass_s = 0.01 + 2048 / RATE
    # Sent less than a quiet pass ago: the pass in flight may still be the quiet one it arrived during.
    assert p.effective_load(views[0], T0 + quiet_pass_s / 2).pass_tokens == 2048
    assert p.effective_load(views[0], T0 + quiet_pass_s + 0.01).pass_tokens == 512
    p.on_completed("c", T0 + 1)
    assert p.effective_load(views[0], T0 + 2).pass_tokens == 2048


def test_documents_spread_once_chats_keep_a_replicas_passes_interactive() -> None:
    # At 3,000 tokens/s a quiet 2048-token pass (0.69 s) is over the target: a second document stays off R2 ...
    slow = dict(prefill_tok_per_s=3000.0, interactive_pass_tokens=512)
    views = [view("R1", load(12_000, **slow)), view("R2", load(**slow))]
    p = LanePolicy()
    assert p.decide("d2", hint("doc2", 12_000), views, T0).replica_id == "R1"
    # ... until a chat has run on R2 past a quiet pass: R2's passes are then 512 tokens, so beside a document
    # chats still meet the target there.
    assert p.decide("c", hint(None, 40), views, T0).replica_id == "R2"
    assert p.decide("d3", hint("doc3", 12_000), views, T0 + 1).replica_id == "R2"


def test_a_replica_that_measured_its_rate_on_chats_alone_still_takes_the_next_document() -> None:
    # R1 prefills a document and measured 4,800 tokens/s on it; R2 served chats only, whose small passes measured
    # 2,200. Both run the same engine: at R1's rate the idle R2 drains the next document first, and a chat beside a
    # document still meets the target on either, so the document goes to R2, not behind the first on R1.
    wait = dict(wait_pass_s=0.25)
    views = [
        view("R1", load(12_000, prefill_tok_per_s=4800.0, **wait)),
        view("R2", load(prefill_tok_per_s=2200.0, **wait)),
    ]
    d = LanePolicy().decide("d2", hint("doc2", 12_000), views, T0)
    assert (d.replica_id, d.traffic_class) == ("R2", TrafficClass.LONG)
    # At R2's own rate it would not have: its drain (5.5 s) is past R1's with both documents (5.1 s).
    assert prefill_drain_s(load(prefill_tok_per_s=2200.0), 12_000) > prefill_drain_s(
        load(12_000, prefill_tok_per_s=4800.0), 12_000
    )


def test_a_sessions_next_document_goes_where_it_drains_soonest_not_to_its_last_replica() -> None:
    # A named session's last replica holds nothing of its next document: the name pins no document there.
    p = LanePolicy()
    wait = dict(wait_pass_s=0.25)
    views = [view("R1", load(**wait)), view("R2", load(**wait))]
    first = p.decide("d1", hint("doc1", 12_000, session="s"), views, T0)
    prefilling = [
        view(v.replica_id, load(12_000, **wait) if v.replica_id == first.replica_id else load(**wait)) for v in views
    ]
    d = p.decide("d2", hint("doc2", 12_000, session="s"), prefilling, T0 + 1)
    assert d.replica_id != first.replica_id
    assert (d.reason, d.traffic_class) == (RouteReason.GAVE_WAY, TrafficClass.LONG)
    # Where it is the soonest, the session's replica keeps it (and says why).
    ahead = [view(v.replica_id, load(**wait) if v.replica_id == d.replica_id else load(40_000, **wait)) for v in views]
    again = p.decide("d3", hint("doc3", 12_000, session="s"), ahead, T0 + 2)
    assert (again.replica_id, again.reason) == (d.replica_id, RouteReason.AFFINITY)
