"""Lane routing, as a pure policy: which replica serves a request, and why.

Inputs are plain records (`RouteHint` from the ingress, a `ReplicaView` per replica built from
the `RoutingStats` replicas publish), the clock is passed in, so the policy is tested without Ray.

The rules, in order:

1. **Traffic class from uncached work.** A request's uncached prompt is what its session does
   not already hold on the replica: `prompt - cached(session, replica)`. The class is the policy
   core's (`scheduler.traffic.classify`) with the engines' `short_request_tokens` (the knob their
   planners use, published with their loads): above it a long document, else a chat. A
   session classed long stays long until its uncached prompt falls below
   `short_request_tokens * (1 - class_hysteresis)`.
2. **Lanes.** Long documents go to the long lane (to the chat lane only if there is no long
   lane). Chats go to the chat lane; they may run in the long lane when their session's cache is
   there, or when every chat replica is busy (spill: the policy core keeps a chat fast beside a
   long prefill). A single replica serves both lanes.
3. **Affinity with a load bound.** A session stays on the replica that holds its cache unless
   that replica is busy for this request *and* some other allowed replica is not ("busy" for a chat:
   `busy_pending_requests` requests waiting for a first token; for a long document:
   `busy_prefill_tokens` uncached tokens waiting). The class is recomputed for the alternative
   (its cache differs), so a follow-up question to a document never lands, uncached, in the chat lane.
4. **Least loaded otherwise.** Chats compare pending requests first (what a chat waits for under
   fair-share chunking), long documents outstanding prefill tokens.
5. **Backpressure limits.** A replica over one of the limits it publishes (`backpressure.assess` on
   the load it published, with this request's uncached tokens; requests waiting for a first token and queued
   prefill tokens: the in-flight limit is Serve's own, `full`) is never chosen: it counts as busy (so affinity gives
   way and chats spill), and when no replica the rules above allow admits the request, the decision
   is a `Shed` (429 at the ingress) instead of a replica. The replica checks again on arrival.

Loads are what replicas last published plus what this router sent them since (published loads are
up to one stats period old).
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from scheduler.traffic import TrafficClass, classify
from serve_app.backpressure import BackpressureLimits, Shed, Verdict, assess, shed_of
from serve_app.config import RoutingKnobs
from serve_app.engine_backend import ReplicaLoad
from serve_app.route_records import (
    Lane,
    ReplicaView,
    RouteDecision,
    RouteHint,
    RouteReason,
    serving_lane,
)


@dataclass(slots=True)
class _Session:
    replica_id: str
    traffic_class: TrafficClass
    cached_tokens: int
    """This router's estimate of what the replica holds for the session."""
    settled_s: float
    """When the estimate was last made true (a request of the session finished there)."""
    last_used_s: float


ARRIVAL_MARGIN_S = 0.05
"""A request sent this long before a load was published may not have reached the replica by then."""
RECENTLY_COMPLETED_S = 30.0


@dataclass(frozen=True, slots=True)
class _InFlight:
    replica_id: str
    request_id: str | None
    session_id: str | None
    prompt_tokens: int
    uncached_tokens: int
    decided_s: float


class LanePolicy:
    """Session table, in-flight accounting and the decision. Thread-safe (Serve may call back from another thread)."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._in_flight: dict[str, _InFlight] = {}
        self._completed: OrderedDict[str, float] = OrderedDict()
        """Engine request ids this router saw finish recently (published loads may still count them)."""
        self._lock = threading.Lock()

    # -- bookkeeping -----------------------------------------------------------------------
    def on_completed(self, request_id: str, now_s: float) -> None:
        with self._lock:
            entry = self._in_flight.pop(request_id, None)
            if entry is None:
                return
            if entry.request_id is not None:
                self._completed[entry.request_id] = now_s
            while self._completed and now_s - next(iter(self._completed.values())) > RECENTLY_COMPLETED_S:
                self._completed.popitem(last=False)
            if entry.session_id is None:
                return
            rec = self._sessions.get(entry.session_id)
            if rec is not None and rec.replica_id == entry.replica_id:
                # Its prompt (at least) is now cached there.
                rec.cached_tokens = max(rec.cached_tokens, entry.prompt_tokens)
                rec.settled_s = now_s

    def session_replica(self, session_id: str) -> str | None:
        with self._lock:
            rec = self._sessions.get(session_id)
            return rec.replica_id if rec else None

    def effective_load(self, view: ReplicaView) -> ReplicaLoad:
        """The published load, corrected by what this router knows happened since it was published.

        Pending requests that finished since are taken out; requests sent after it (or just before,
        possibly not yet arrived) and not in it are added as waiting.
        """
        gone = [rid for rid in view.pending if rid in self._completed]
        sent = [
            e
            for e in self._in_flight.values()
            if e.replica_id == view.replica_id
            and e.decided_s > view.stats_time_s - ARRIVAL_MARGIN_S
            and e.request_id not in view.pending
        ]
        if not gone and not sent:
            return view.load
        num_waiting = view.load.num_waiting + len(sent)
        num_prefilling = view.load.num_prefilling
        # A finished pending request was waiting or prefilling: take it from prefilling first.
        num_gone_prefilling = min(len(gone), num_prefilling)
        num_prefilling -= num_gone_prefilling
        num_waiting = max(0, num_waiting - (len(gone) - num_gone_prefilling))
        return replace(
            view.load,
            num_waiting=num_waiting,
            num_prefilling=num_prefilling,
            prefill_tokens=max(
                0, view.load.prefill_tokens - sum(view.pending[r] for r in gone) + sum(e.uncached_tokens for e in sent)
            ),
        )

    # -- the decision ----------------------------------------------------------------------
    def decide(
        self, request_id: str, hint: RouteHint | None, views: Sequence[ReplicaView], now_s: float
    ) -> RouteDecision | Shed | None:
        """Choose a replica, record the choice, and say why; a `Shed` when every replica the lanes allow is over
        a backpressure limit. None when there is no replica at all."""
        if not views:
            return None
        hint = hint or RouteHint(session_id=None, prompt_tokens=1)
        knobs = hint.knobs
        with self._lock:
            self._expire(now_s, knobs)
            decision = self._decide(hint, views)
            if isinstance(decision, RouteDecision):  # a shed request is never sent: nothing to account for
                self._record(request_id, hint, decision, now_s, knobs)
        return decision

    def _decide(self, hint: RouteHint, views: Sequence[ReplicaView]) -> RouteDecision | Shed:
        by_id = {v.replica_id: v for v in views}
        if hint.target_replica is not None and hint.target_replica in by_id:
            v = by_id[hint.target_replica]
            cls = classify(hint.prompt_tokens, v.short_request_tokens)
            lane = serving_lane(v.lane, cls)
            return RouteDecision(v.replica_id, lane, cls, RouteReason.TARGETED, 0, hint.session_id, v.slo_for(cls))

        usable = [v for v in views if not v.full] or list(views)
        sid = hint.session_id
        rec = self._sessions.get(sid) if sid else None
        pinned = self._pinned(sid, rec, usable)
        c = _Candidates(hint, rec, usable, {v.replica_id: self.effective_load(v) for v in usable})
        takers = [v for v in usable if c.takes(v)]
        if pinned is not None:
            pinned_cls = c.traffic_class(pinned)
            if c.allowed(pinned, pinned_cls, is_pinned=True):
                others = [v for v in takers if v is not pinned and c.admits(v)]
                better = [v for v in others if not c.busy(v, c.traffic_class(v))]
                if c.admits(pinned) and (not c.busy(pinned, pinned_cls) or not better):
                    return c.decision(pinned, RouteReason.AFFINITY)
                # Busy and another allowed replica is not, or over a limit: the session moves (its cache is lost).
                if better or others:
                    return c.best(better or others, RouteReason.GAVE_WAY)
                return c.shed([pinned, *takers])
            return c.best_admitting(takers or usable, RouteReason.MOVED)
        return c.best_admitting(takers or usable, RouteReason.LEAST_LOADED)

    def _pinned(self, sid: str | None, rec: _Session | None, usable: Sequence[ReplicaView]) -> ReplicaView | None:
        if not sid:
            return None
        if rec is not None:
            for v in usable:
                if v.replica_id == rec.replica_id:
                    return v
        # Unknown here (another ingress replica routed it, or this router restarted): where is it cached?
        holders = [(v.sessions.get(sid, 0), v.replica_id, v) for v in usable if v.sessions.get(sid, 0) > 0]
        return max(holders)[2] if holders else None

    def _record(self, request_id: str, hint: RouteHint, d: RouteDecision, now_s: float, knobs: RoutingKnobs) -> None:
        self._in_flight[request_id] = _InFlight(
            d.replica_id, hint.request_id, d.session_id, hint.prompt_tokens, d.uncached_tokens, now_s
        )
        sid = d.session_id
        if not sid or d.reason is RouteReason.TARGETED:
            return
        rec = self._sessions.get(sid)
        if rec is None or rec.replica_id != d.replica_id:
            cached = hint.prompt_tokens - d.uncached_tokens
            self._sessions[sid] = _Session(d.replica_id, d.traffic_class, cached, now_s, now_s)
        else:
            rec.traffic_class = d.traffic_class
            rec.last_used_s = now_s
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


def _cached_on(sid: str | None, rec: _Session | None, v: ReplicaView) -> int:
    if not sid:
        return 0
    if rec is not None and rec.replica_id == v.replica_id and v.stats_time_s <= rec.settled_s:
        # Published stats predate the session's last finished request there: trust our own estimate.
        return rec.cached_tokens
    return v.sessions.get(sid, 0)


def _agreed_threshold(views: Sequence[ReplicaView]) -> int:
    """The engines' `short_request_tokens` for one decision: what most replicas publish (the larger on a tie).

    Replicas of one deployment share their policy; they disagree only for a stats period during a live
    change. One value per decision keeps the class a property of the request's cache, not of which
    replica happens to be on the old policy (two thresholds could make a document a chat on one replica
    and a long document on the other, with no lane left that takes it)."""
    votes = Counter(v.short_request_tokens for v in views)
    return max(votes, key=lambda t: (votes[t], t))


class _Candidates:
    """One decision's view of the usable replicas: each rule of the module docstring as a named method."""

    def __init__(
        self, hint: RouteHint, rec: _Session | None, usable: Sequence[ReplicaView], loads: Mapping[str, ReplicaLoad]
    ) -> None:
        self.hint = hint
        self.knobs = hint.knobs
        self.rec = rec
        self.loads = loads
        self.short_request_tokens = _agreed_threshold(usable)
        self.verdicts = {v.replica_id: self._verdict(v) for v in usable}
        """Rule 5 for each usable replica, judged once per decision (every other rule asks it)."""
        self.has_long_lane = any(v.lane is not Lane.CHAT for v in usable)
        self.has_chat_lane = any(v.lane is not Lane.LONG for v in usable)
        chat_lane = [v for v in usable if v.lane is not Lane.LONG]
        self.chat_saturated = bool(chat_lane) and all(self.busy(v, TrafficClass.SHORT) for v in chat_lane)

    def uncached_tokens(self, v: ReplicaView) -> int:
        return max(1, self.hint.prompt_tokens - _cached_on(self.hint.session_id, self.rec, v))

    def traffic_class(self, v: ReplicaView) -> TrafficClass:
        """Rule 1: the class on this replica (its cache and its engine's threshold)."""
        previous = self.rec.traffic_class if self.rec else None
        return classify(self.uncached_tokens(v), self.short_request_tokens, previous, self.knobs.class_hysteresis)

    def _verdict(self, v: ReplicaView) -> Verdict:
        """Rule 5: may `v` take the request under the limits it published (unknown limits: yes)."""
        if v.limits is None:
            return Verdict(True)
        # In-flight requests are Serve's limit (`full`, its own queue): shedding on them here would bypass that queue.
        # Judged on the load the replica published, not the corrected one: the correction counts every request sent
        # since as still waiting for its first token, which at high request rates sheds requests the replica could
        # take (the engine's own check on arrival covers what a stale publication misses).
        return assess(v.load, self.uncached_tokens(v), v.limits, count_ongoing=False)

    def admits(self, v: ReplicaView) -> bool:
        return self.verdicts[v.replica_id].admits

    def busy(self, v: ReplicaView, cls: TrafficClass) -> bool:
        """Rule 3's bound: what the class waits for on that replica (over a limit is busy too)."""
        if not self.admits(v):
            return True
        load = self.loads[v.replica_id]
        if cls is TrafficClass.LONG:
            return load.prefill_tokens >= self.knobs.busy_prefill_tokens
        return load.num_pending >= self.knobs.busy_pending_requests

    def home(self, v: ReplicaView, cls: TrafficClass) -> bool:
        """Rule 2: the class's own lane (or the other one when its own has no replica)."""
        if v.lane is Lane.BOTH:
            return True
        if cls is TrafficClass.LONG:
            return v.lane is Lane.LONG or not self.has_long_lane
        return v.lane is Lane.CHAT or not self.has_chat_lane

    def allowed(self, v: ReplicaView, cls: TrafficClass, is_pinned: bool = False) -> bool:
        if self.home(v, cls):
            return True
        # A chat outside the chat lane: where its cache is, or as a spill when the chat lane is saturated.
        return cls is TrafficClass.SHORT and (is_pinned or (self.knobs.chat_spill and self.chat_saturated))

    def takes(self, v: ReplicaView) -> bool:
        """Whether `v` may serve the request when it is not the session's pinned replica."""
        return self.allowed(v, self.traffic_class(v))

    def best(self, candidates: Sequence[ReplicaView], reason: RouteReason) -> RouteDecision:
        """Rule 4: not busy first, then its own lane, then least loaded by what the class waits for."""

        def key(v: ReplicaView):
            cls = self.traffic_class(v)
            load = self.loads[v.replica_id]
            if cls is TrafficClass.LONG:
                by_load = (load.prefill_tokens, load.num_pending, load.num_decoding)
            else:
                by_load = (load.num_pending, load.num_decoding, load.prefill_tokens)
            return (self.busy(v, cls), not self.home(v, cls), by_load, v.replica_id)

        chosen = min(candidates, key=key)
        cls = self.traffic_class(chosen)
        mismatched = chosen.lane is not Lane.BOTH and (chosen.lane is Lane.LONG) != (cls is TrafficClass.LONG)
        if mismatched and reason is not RouteReason.GAVE_WAY:
            # Outside its own lane: a chat spilled to a saturated chat lane's neighbour, or the lane is missing.
            reason = RouteReason.NO_LANE if self.home(chosen, cls) else RouteReason.SPILL
        return self.decision(chosen, reason)

    def best_admitting(self, candidates: Sequence[ReplicaView], reason: RouteReason) -> RouteDecision | Shed:
        """Rule 4 among the candidates under their limits; rule 5's shed when there is none."""
        admitting = [v for v in candidates if self.admits(v)]
        return self.best(admitting, reason) if admitting else self.shed(candidates)

    def shed(self, over: Sequence[ReplicaView]) -> Shed:
        """Every allowed replica is over a limit: the answer the most lenient of them would give."""
        verdicts = {v.replica_id: self.verdicts[v.replica_id] for v in over}
        return shed_of(verdicts, {v.replica_id: v.limits or BackpressureLimits() for v in over})

    def decision(self, v: ReplicaView, reason: RouteReason) -> RouteDecision:
        cls = self.traffic_class(v)
        return RouteDecision(
            v.replica_id,
            serving_lane(v.lane, cls),
            cls,
            reason,
            self.uncached_tokens(v),
            self.hint.session_id,
            v.slo_for(cls),
        )
