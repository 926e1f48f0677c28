"""Lane routing, as a pure policy: which replica serves a request, and why.

Inputs are plain records (`RouteHint` from the ingress, a `ReplicaView` per replica built from
the `RoutingStats` replicas publish), the clock is passed in, so the policy is tested without Ray.

Replicas serve in lanes: `Lane.BOTH` (the default: every replica takes either class, and its role follows
the load) or static ones (`EngineKnobs.long_lane_replicas`: ranks below it the long lane, the others the chat
lane). The rules, in order (each is a method of `placement.Candidates`):

0. **Ready replicas only.** A replica whose engine is loading or restarting (it publishes `ready: false`) gets
   nothing; with none ready the router chooses nothing and Serve asks again, so placement recovers as soon
   as one is up.
1. **Traffic class from uncached work.** A request's uncached prompt is what the replica does not already hold of
   it: `prompt - cached(prompt, replica)`, the prompt's longest prefix the replica's engine holds (`prefix_pages`:
   the pages it published, and the finished requests this router sent it since). No session id is needed: a
   follow-up question on a cached document is a chat on the replica that holds the document, and a document on any
   other. The class is the policy core's (`scheduler.traffic.classify`) with the engines' `short_request_tokens`
   (published with their loads); a named session classed long stays long until its uncached prompt falls below
   `short_request_tokens * (1 - class_hysteresis)`.
2. **Lanes.** With static lanes, documents go to the long lane and chats to the chat lane; a chat may run
   in the long lane where its prefix is cached, or when every chat replica is busy (`chat_spill`).
3. **Chats where their first token comes soonest.** Each replica's TTFT for this request is predicted from
   what it published (`ttft_prediction.predict_ttft_s`: outstanding prefill, pass cost, whether a short
   request overtakes queued prefill there), at one prefill rate for every replica, the highest published
   (`ttft_prediction.with_engine_rate`: a rate measured on chats alone understates a document's). A chat replica
   is busy when, behind a document, that prediction is over the engines' TTFT target (or
   `busy_pending_requests` wait there); a chat goes to the lowest prediction.
4. **Documents anywhere the chat SLO survives.** A document may use any replica as long as, with it there,
   some replica chats may use still predicts a chat (the 99th percentile of the uncached prompts of the chats
   this router placed lately, as the engines' own reserve: `scheduler.slo_sizing.ChatPrompts`) within the TTFT
   target;
   among those, the one that drains soonest (`busy_prefill_tokens` bounds how much waits on one). A long
   lane is so reserved only when the SLO needs it: an engine whose chats wait behind its documents
   (upstream's first come, first served) keeps its documents off a replica chats need.
5. **Affinity.** A request goes to the replica that holds most of its prompt (where no replica holds any, the
   replica of its session's last request, when the client named a session) unless that replica is busy for this
   request *and* another allowed replica is not, and is predicted faster (the class is recomputed there:
   a document's follow-up elsewhere is a whole document again, so it stays unless that is sooner). A request that
   is a document even there is placed as any document is (rule 4): the prefix it holds counts in each replica's
   drain, and a session's name alone pins no document. A chat behind a document stays with its cache while its
   first token there is predicted within the TTFT target (the history it keeps cached is prefill no engine
   repeats); past the target it is busy there, and moves to a replica predicted faster.
6. **Backpressure limits.** A replica over one of the limits it publishes (`backpressure.assess` on the load
   it published, with this request's uncached tokens; the in-flight limit is Serve's own, `full`) is never
   chosen: it counts as busy, and when no replica the rules above allow admits the request, the decision is a
   `Shed` (429 at the ingress) instead of a replica. The replica checks again on arrival.
7. **Tenant limits.** A request that would take its tenant's queued prompt tokens (counted from what this router
   sent) over the tenant's limit is a `Shed` naming the tenant, whatever other tenants queue (`tenant_limits`).

Loads are what replicas last published (up to one stats period old), corrected by what this router knows happened
since: the requests it sent since, and its requests that have ended (`load_correction`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from scheduler.slo_sizing import ChatPrompts
from scheduler.traffic import TrafficClass, classify
from serve_app.config import RoutingKnobs
from serve_app.replica.backend import ReplicaLoad
from serve_app.routing.backpressure import Shed
from serve_app.routing.load_correction import Completed, InFlight, corrected_load
from serve_app.routing.placement import Candidates, SessionRecord
from serve_app.routing.prefix_pages import PAGE_TOKENS, SentPrefixes, held_pages
from serve_app.routing.records import ARRIVAL_MARGIN_S, ReplicaView, RouteDecision, RouteHint, RouteReason, serving_lane
from serve_app.routing.tenant_limits import over_limit, queued_tokens
from serve_app.routing.ttft_prediction import with_engine_rate

RECENTLY_COMPLETED_S = 30.0


class LanePolicy:
    """Session table, in-flight accounting and the decision. Thread-safe (Serve may call back from another thread)."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, SessionRecord] = OrderedDict()
        self._in_flight: dict[str, InFlight] = {}
        self._completed: Completed = OrderedDict()
        """Requests this router saw end lately: published loads may still count them."""
        self._chat_prompts = ChatPrompts()
        """The uncached prompts of the chats this router placed lately: the chat documents must leave room for."""
        self._sent = SentPrefixes()
        """The prefix pages this router sent each replica, until the replica's publications speak for them."""
        self._lock = threading.Lock()

    # -- bookkeeping -----------------------------------------------------------------------
    def on_completed(self, request_id: str, now_s: float) -> None:
        with self._lock:
            entry = self._in_flight.pop(request_id, None)
            if entry is None:
                return
            if entry.request_id is not None:
                self._completed[entry.request_id] = (entry, now_s)
            while self._completed and now_s - next(iter(self._completed.values()))[1] > RECENTLY_COMPLETED_S:
                self._completed.popitem(last=False)
            self._sent.finished(entry.replica_id, entry.prefix_pages, now_s)

    def session_replica(self, session_id: str) -> str | None:
        with self._lock:
            rec = self._sessions.get(session_id)
            return rec.replica_id if rec else None

    def footprint(self) -> dict[str, int]:
        """The sizes of what this router keeps (each bounded: sessions by `max_sessions`, in-flight requests by the
        session TTL, sent pages per replica by `SentPrefixes.max_pages`)."""
        with self._lock:
            return {
                "sessions": len(self._sessions),
                "in_flight": len(self._in_flight),
                "completed": len(self._completed),
                "sent_pages": self._sent.size(),
            }

    def cached_tokens(self, pages: tuple[int, ...], view: ReplicaView) -> int:
        """Tokens of a prompt (its `pages`) the replica holds: what it published, and what this router sent it
        that no publication made since has denied (`SentPrefixes.holder`)."""
        if not pages:
            return 0
        held = self._sent.holder(view.replica_id, view.prefixes, view.stats_time_s - ARRIVAL_MARGIN_S)
        return held_pages(pages, held) * PAGE_TOKENS

    def effective_load(self, view: ReplicaView, now_s: float | None = None) -> ReplicaLoad:
        """The published load, corrected by what this router knows happened since (`load_correction`)."""
        return corrected_load(view, self._in_flight.values(), self._completed, now_s)

    def tenant_queued_tokens(self, tenant: str, views: Sequence[ReplicaView]) -> int:
        """`tenant`'s queued prompt tokens, as this router counts them (`tenant_limits.queued_tokens`)."""
        return queued_tokens(self._in_flight.values(), tenant, views)

    # -- the decision ----------------------------------------------------------------------
    def decide(
        self, request_id: str, hint: RouteHint | None, views: Sequence[ReplicaView], now_s: float
    ) -> RouteDecision | Shed | None:
        """Choose a replica, record the choice, and say why; a `Shed` when every replica the lanes allow is over
        a backpressure limit. None when there is no replica at all, or none is ready."""
        if not views:
            return None
        hint = hint or RouteHint(session_id=None, prompt_tokens=1)
        knobs = hint.knobs
        with self._lock:
            self._expire(now_s, knobs)
            decision = self._decide(hint, views, now_s)
            if isinstance(decision, RouteDecision):  # rule 7
                decision = over_limit(hint, decision, views, self._in_flight.values()) or decision
            if isinstance(decision, RouteDecision):  # a shed request is never sent: nothing to account for
                self._record(request_id, hint, decision, now_s, knobs)
        return decision

    def _decide(self, hint: RouteHint, views: Sequence[ReplicaView], now_s: float) -> RouteDecision | Shed | None:
        by_id = {v.replica_id: v for v in views}
        if hint.target_replica is not None and hint.target_replica in by_id:
            v = by_id[hint.target_replica]
            cls = classify(hint.prompt_tokens, v.short_request_tokens)
            lane = serving_lane(v.lane, cls)
            return RouteDecision(v.replica_id, lane, cls, RouteReason.TARGETED, 0, hint.session_id, v.slo_for(cls))

        ready = [v for v in views if v.load.ready]
        if not ready:
            return None
        usable = [v for v in ready if not v.full] or ready
        self._sent.forget_others({v.replica_id for v in views})
        sid = hint.session_id
        rec = self._sessions.get(sid) if sid else None
        cached = {v.replica_id: self.cached_tokens(hint.prefix_pages, v) for v in usable}
        pinned = self._pinned(rec, usable, cached)
        loads = with_engine_rate({v.replica_id: self.effective_load(v, now_s) for v in usable})
        c = Candidates(hint, rec, usable, loads, cached, self._chat_prompts.reserve_tokens)
        takers = [v for v in usable if c.takes(v)]
        if pinned is not None:
            pinned_cls = c.traffic_class(pinned)
            if c.allowed(pinned, pinned_cls, is_pinned=True):
                if pinned_cls is TrafficClass.LONG:
                    return c.pinned_document(pinned, takers)
                others = [v for v in takers if v is not pinned and c.admits(v)]
                better = [v for v in others if not c.busy(v, c.traffic_class(v)) and c.faster(v, pinned)]
                stays = not c.busy(pinned, pinned_cls) or not better
                if c.admits(pinned) and stays:
                    return c.decision(pinned, RouteReason.AFFINITY)
                # Busy and another allowed replica is not, or over a limit: the session moves (its cache is lost).
                if better or others:
                    return c.best(better or others, RouteReason.GAVE_WAY)
                return c.shed([pinned, *takers])
            return c.best_admitting(takers or usable, RouteReason.MOVED)
        return c.best_admitting(takers or usable, RouteReason.LEAST_LOADED)

    @staticmethod
    def _pinned(rec: SessionRecord | None, usable: Sequence[ReplicaView], cached: dict[str, int]) -> ReplicaView | None:
        """The replica holding most of the prompt (the named session's last replica among several that hold as much,
        none when it is not one of them: a prefix every replica holds, a shared system prompt, pins nothing); where
        none holds any, the named session's last replica."""
        most = max(cached.values(), default=0)
        holders = [v for v in usable if most > 0 and cached[v.replica_id] == most]
        last = next((v for v in usable if v.replica_id == rec.replica_id), None) if rec is not None else None
        if len(holders) == 1:
            return holders[0]
        if not holders or any(v is last for v in holders):
            return last
        return None

    def _record(self, request_id: str, hint: RouteHint, d: RouteDecision, now_s: float, knobs: RoutingKnobs) -> None:
        self._in_flight[request_id] = InFlight(
            d.replica_id,
            hint.request_id,
            d.session_id,
            hint.prompt_tokens,
            d.uncached_tokens,
            now_s,
            d.traffic_class is TrafficClass.SHORT,
            hint.prefix_pages,
            hint.tenant,
        )
        if d.traffic_class is TrafficClass.SHORT:
            self._chat_prompts.record([d.uncached_tokens])
        if d.reason is RouteReason.TARGETED:
            return
        self._sent.sent(d.replica_id, hint.prefix_pages)
        sid = d.session_id
        if not sid:
            return
        self._sessions[sid] = SessionRecord(d.replica_id, d.traffic_class, now_s)
        self._sessions.move_to_end(sid)
        while len(self._sessions) > knobs.max_sessions:
            self._sessions.popitem(last=False)

    def _expire(self, now_s: float, knobs: RoutingKnobs) -> None:
        stale = [rid for rid, e in self._in_flight.items() if now_s - e.decided_s > knobs.session_ttl_s]
        for rid in stale:  # completion callbacks that never came (a replica died mid-request)
            del self._in_flight[rid]
        while self._sessions:
            sid, rec = next(iter(self._sessions.items()))
            if now_s - rec.last_used_s <= knobs.session_ttl_s:
                break
            del self._sessions[sid]
