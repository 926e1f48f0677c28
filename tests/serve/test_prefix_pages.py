"""Placement by cached prefix: page hashes, the router's record of what it sent, and the decisions they drive."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from scheduler.slo_sizing import ChatPrompts
from scheduler.traffic import TrafficClass, classify
from serve_app.config import RoutingKnobs
from serve_app.replica.backend import ReplicaLoad
from serve_app.routing.backpressure import BackpressureLimits, assess
from serve_app.routing.lane_policy import ARRIVAL_MARGIN_S, LanePolicy
from serve_app.routing.placement import Candidates
from serve_app.routing.prefix_pages import PAGE_TOKENS, SentPrefixes, held_pages, held_tokens, page_hashes
from serve_app.routing.records import Lane, ReplicaView, RouteDecision, RouteHint, RouteReason
from serve_app.routing.ttft_prediction import predict_ttft_s, prefill_drain_s, with_engine_rate
from tests.hypothesis_budget import examples
from tests.serve.prefixes import held, pages, token_ids
from tests.serve.strategies import loads_st

T0 = 1000.0
KNOBS = RoutingKnobs()


def test_a_longer_prompt_extends_the_page_hashes_of_its_prefix_and_a_different_one_shares_none() -> None:
    doc, followup = page_hashes(token_ids("doc", 1000)), page_hashes(token_ids("doc", 1300))
    assert len(doc) == 1000 // PAGE_TOKENS and followup[: len(doc)] == doc
    assert not set(page_hashes(token_ids("other", 1000))) & set(doc)
    # One token changed: every page from it on differs (a hash names the whole prefix before it).
    changed = token_ids("doc", 1000).copy()
    changed[200] += 1
    assert page_hashes(changed)[: 200 // PAGE_TOKENS] == doc[: 200 // PAGE_TOKENS]
    assert not set(page_hashes(changed)[200 // PAGE_TOKENS :]) & set(doc)


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(0, 40), st.integers(0, 40))
def test_the_held_prefix_is_found_by_bisection(num_pages: int, num_held: int) -> None:
    chain = pages("p", num_pages * PAGE_TOKENS + 7)
    published = set(chain[: min(num_held, num_pages)]) | set(pages("other", 640))
    assert held_pages(chain, published.__contains__) == min(num_held, num_pages)
    assert held_tokens(chain, published) == min(num_held, num_pages) * PAGE_TOKENS


def test_the_sent_record_counts_until_a_later_publication_speaks_and_stays_bounded() -> None:
    sent = SentPrefixes(max_pages=10)
    doc = pages("doc", 8 * PAGE_TOKENS)
    sent.sent("A", doc)
    held = sent.holder("A", frozenset(), published_s=T0)
    assert held_pages(doc, held) == 0  # in flight: being prefilled, not cheap yet
    sent.finished("A", doc, T0 + 1)
    assert held_pages(doc, sent.holder("A", frozenset(), published_s=T0 + 0.5)) == 8  # published before it finished
    assert held_pages(doc, sent.holder("A", frozenset(), published_s=T0 + 2)) == 0  # published after: evicted
    assert held_pages(doc, sent.holder("A", frozenset(doc[:3]), published_s=T0 + 2)) == 3  # the engine's word
    # Over the bound, a prompt loses its last pages first: what is left is still a run from its start.
    sent.sent("A", doc)  # sent again: what finished before still counts while the new copy is in flight
    assert held_pages(doc, sent.holder("A", frozenset(), published_s=T0 + 0.5)) == 8
    sent.sent("A", pages("chat", 4 * PAGE_TOKENS))
    assert sent.size() == 10
    assert held_pages(doc, sent.holder("A", frozenset(), published_s=T0)) == 6
    sent.forget_others({"B"})
    assert sent.size() == 0


def both(rid: str, load: ReplicaLoad, cached: dict[str, int] | None = None, stats_time_s: float = T0) -> ReplicaView:
    return ReplicaView(rid, Lane.BOTH, load, stats_time_s, held(cached), short_request_tokens=2048)


def test_a_followup_without_a_session_goes_where_its_document_is_cached() -> None:
    p = LanePolicy()
    idle = ReplicaLoad(prefill_tok_per_s=2000, pass_fixed_s=0.01, pass_tokens=2048, short_first=True)
    views = [both("A", idle), both("B", idle, {"doc": 12_000})]
    d = p.decide("f", RouteHint(None, 12_040, pages("doc", 12_040), KNOBS), views, T0)
    assert isinstance(d, RouteDecision)
    assert (d.replica_id, d.reason, d.uncached_tokens) == ("B", RouteReason.AFFINITY, 12_040 - 12_000 // 64 * 64)
    assert d.traffic_class.value == "short"  # a question on a cached document is a chat where the document is
    # A shared system prompt every replica holds pins none: the least loaded takes it.
    views = [both("A", idle, {"sys": 2000}), both("B", idle, {"sys": 2000, "doc": 12_000})]
    d = p.decide("s", RouteHint(None, 2050, pages("sys", 2050), KNOBS), views, T0)
    assert isinstance(d, RouteDecision) and d.reason is RouteReason.LEAST_LOADED


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(loads_st, min_size=2, max_size=4),
    st.integers(0, 3),
    st.integers(1, 30_000),
    st.integers(1, 30_000),
    st.booleans(),
)
def test_a_request_goes_where_its_prefix_is_unless_over_a_limit_or_a_cold_prefill_elsewhere_is_sooner(
    replica_loads, holder_index, cached, extra, limited
) -> None:
    assume(holder_index < len(replica_loads))
    limits = BackpressureLimits(max_queued_requests=4, max_queued_prefill_tokens=70_000) if limited else None
    prompt = cached + extra
    views = [
        ReplicaView(
            f"R{i}",
            Lane.BOTH,
            load,
            T0,
            held({"doc": cached}) if i == holder_index else frozenset(),
            limits=limits,
            short_request_tokens=2048,
        )
        for i, load in enumerate(replica_loads)
    ]
    holder = views[holder_index]
    held_of_it = cached // PAGE_TOKENS * PAGE_TOKENS
    assume(held_of_it > 0)
    d = LanePolicy().decide("r", RouteHint(None, prompt, pages("doc", prompt), KNOBS), views, T0)
    if d is None or not isinstance(d, RouteDecision) or d.replica_id == holder.replica_id:
        return
    # It left the replica that holds its prefix: that replica was over a limit, or a cold prefill elsewhere is
    # predicted to give the first token sooner. Predicted as the router predicts: every replica at the engine's rate
    # (`with_engine_rate`); a document (even on the holder) by when it would be prefilled (its drain).
    over = limits is not None and not assess(holder.load, max(1, prompt - held_of_it), limits).admits
    rated = with_engine_rate({v.replica_id: v.load for v in views})
    document = classify(max(1, prompt - held_of_it), 2048) is TrafficClass.LONG
    predict = prefill_drain_s if document else predict_ttft_s
    here = predict(rated[holder.replica_id], max(1, prompt - held_of_it))
    # A document's drain ties break by the tokens queued (`Candidates.best`): as soon elsewhere counts.
    sooner = [
        v
        for v in views
        if v is not holder
        and ((p := predict(rated[v.replica_id], prompt) or 0) < (here or 0) or (document and p == (here or 0)))
    ]
    request = RouteHint(None, prompt, pages("doc", prompt), KNOBS)
    cached_on = {holder.replica_id: held_of_it}
    c = Candidates(request, None, views, rated, cached_on, ChatPrompts().reserve_tokens)
    # Or, for a document, rule 4 kept it off the holder: a chat would then miss the target everywhere, or the holder
    # already queues `busy_prefill_tokens`.
    kept_off = document and (not c.keeps_chat_slo(holder) or c.busy(holder, TrafficClass.LONG))
    assert over or sooner or kept_off


@settings(max_examples=examples(100), deadline=None)
@given(st.floats(0, 5), st.floats(ARRIVAL_MARGIN_S + 0.001, 30))
def test_an_evicted_prefix_attracts_nothing(finish_after_s: float, published_after_finish_s: float) -> None:
    p = LanePolicy()
    idle = ReplicaLoad(prefill_tok_per_s=2000, pass_tokens=2048, short_first=True)
    hint = RouteHint(None, 12_000, pages("doc", 12_000), KNOBS)
    first = p.decide("d", hint, [both("A", idle), both("B", idle)], T0)
    assert isinstance(first, RouteDecision)
    finished_s = T0 + finish_after_s
    p.on_completed("d", finished_s)
    # The holder published, after the document finished, that it holds nothing of it (evicted).
    published_s = finished_s + published_after_finish_s
    views = [both("A", idle, stats_time_s=published_s), both("B", idle, stats_time_s=published_s)]
    assert all(p.cached_tokens(hint.prefix_pages, v) == 0 for v in views)
    followup = RouteHint(None, 12_050, pages("doc", 12_050), KNOBS)
    d = p.decide("f", followup, views, published_s + 0.1)
    assert isinstance(d, RouteDecision) and d.uncached_tokens == 12_050 and d.reason is not RouteReason.AFFINITY


@settings(max_examples=examples(30), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 5000), st.booleans()), min_size=50, max_size=300))
def test_the_routers_state_stays_bounded_whatever_the_traffic(requests) -> None:
    knobs = RoutingKnobs(max_sessions=8, session_ttl_s=5)
    p = LanePolicy()
    p._sent = SentPrefixes(max_pages=64)
    idle = ReplicaLoad(prefill_tok_per_s=2000, pass_tokens=2048, short_first=True)
    views = [both("A", idle), both("B", idle), both("C", idle)]
    for i, (name, tokens, named) in enumerate(requests):
        now = T0 + i * 0.5
        hint = RouteHint(f"s{name}" if named else None, tokens, pages(f"p{name}", tokens), knobs, request_id=f"q{i}")
        p.decide(f"r{i}", hint, views, now)
        if i % 3:
            p.on_completed(f"r{i}", now)
        footprint = p.footprint()
        assert footprint["sent_pages"] <= 64 * len(views)
        assert footprint["sessions"] <= 8
        assert footprint["in_flight"] <= 5 / 0.5 + 1  # requests never completed expire with the session TTL


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(0, 700), st.integers(0, 20), st.sampled_from([16, PAGE_TOKENS]))
def test_page_hashes_continue_from_the_known_hashes_of_a_prefix(num_tokens: int, num_known: int, size: int) -> None:
    ids = token_ids("chain", num_tokens)
    whole = page_hashes(ids, size)
    known = whole[: min(num_known, len(whole))]
    assert page_hashes(ids, size, known) == whole
