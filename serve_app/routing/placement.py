"""One routing decision's view of the replicas: each placement rule of `lane_policy` as a named method.

`Candidates` is built per decision from the usable replicas, their loads (published, corrected by the
router), the request's hint, the prompt tokens each replica holds (`cached`) and the session record, if the client
named one. It answers: the request's class on a replica (its cache there), whether a replica admits it
(backpressure), is busy for it, is its class's home, would keep the chat SLO if the request went there, and which
candidate is best. TTFTs come from `ttft_prediction.predict_ttft_s`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from scheduler.traffic import TrafficClass, classify
from serve_app.replica.backend import ReplicaLoad
from serve_app.routing.backpressure import BackpressureLimits, Shed, Verdict, assess, shed_of
from serve_app.routing.records import Lane, ReplicaView, RouteDecision, RouteHint, RouteReason, serving_lane
from serve_app.routing.ttft_prediction import predict_ttft_s, prefill_drain_s, with_request


@dataclass(slots=True)
class SessionRecord:
    """A session the client named: where its last request went (a hint where no replica holds its prefix) and its
    class (for the class's hysteresis)."""

    replica_id: str
    traffic_class: TrafficClass
    last_used_s: float


def _agreed_threshold(views: Sequence[ReplicaView]) -> int:
    """The engines' `short_request_tokens` for one decision: what most replicas publish (the larger on a tie).

    Replicas of one deployment share their policy; they disagree only for a stats period during a live
    change. One value per decision keeps the class a property of the request's cache, not of which
    replica happens to be on the old policy (two thresholds could make a document a chat on one replica
    and a long document on the other, with no lane left that takes it)."""
    votes = Counter(v.short_request_tokens for v in views)
    return max(votes, key=lambda t: (votes[t], t))


def _or_inf(x: float | None) -> float:
    return math.inf if x is None else x


class Candidates:
    def __init__(
        self,
        hint: RouteHint,
        rec: SessionRecord | None,
        usable: Sequence[ReplicaView],
        loads: Mapping[str, ReplicaLoad],
        cached: Mapping[str, int],
        chat_tokens: int,
    ) -> None:
        self.hint = hint
        self.knobs = hint.knobs
        self.rec = rec
        self.usable = usable
        self.loads = loads
        self.cached = cached
        """Replica -> tokens of the request's prompt it holds (`LanePolicy.cached_tokens`)."""
        self.short_request_tokens = _agreed_threshold(usable)
        self.chat_tokens = min(chat_tokens, self.short_request_tokens)
        """The chat a document must leave room for: the p99 of the chats routed lately (`ChatPrompts`), at most
        the class's bound."""
        self.ttft_target_s = min(v.ttft_target_s for v in usable)
        """The strictest target published: a chat must meet it wherever it lands."""
        self.verdicts = {v.replica_id: self._verdict(v) for v in usable}
        """Backpressure for each usable replica, judged once per decision (every other rule asks it)."""
        self.has_long_lane = any(v.lane is not Lane.CHAT for v in usable)
        self.has_chat_lane = any(v.lane is not Lane.LONG for v in usable)
        chat_lane = [v for v in usable if v.lane is not Lane.LONG]
        self.chat_saturated = bool(chat_lane) and all(self.busy(v, TrafficClass.SHORT) for v in chat_lane)
        self._keeps: dict[str, bool] = {}

    def uncached_tokens(self, v: ReplicaView) -> int:
        return max(1, self.hint.prompt_tokens - self.cached.get(v.replica_id, 0))

    def traffic_class(self, v: ReplicaView) -> TrafficClass:
        """The class on this replica (its cache and the engines' threshold)."""
        previous = self.rec.traffic_class if self.rec else None
        return classify(self.uncached_tokens(v), self.short_request_tokens, previous, self.knobs.class_hysteresis)

    def _verdict(self, v: ReplicaView) -> Verdict:
        """May `v` take the request under the limits it published (unknown limits: yes)."""
        if v.limits is None:
            return Verdict(True)
        # Judged on the load the replica published, not the corrected one: the correction counts every request sent
        # since as still waiting for its first token, which at high request rates sheds requests the replica could
        # take (the engine's own check on arrival covers what a stale publication misses).
        return assess(v.load, self.uncached_tokens(v), v.limits)

    def admits(self, v: ReplicaView) -> bool:
        return self.verdicts[v.replica_id].admits

    def predicted_ttft_s(self, v: ReplicaView) -> float | None:
        """This request's first token on `v` (None: `v` published no prefill rate)."""
        return predict_ttft_s(self.loads[v.replica_id], self.uncached_tokens(v))

    def faster(self, a: ReplicaView, b: ReplicaView) -> bool:
        """Whether `a` is predicted to give the first token sooner than `b` (without both predictions: yes)."""
        pa, pb = self.predicted_ttft_s(a), self.predicted_ttft_s(b)
        return pa is None or pb is None or pa < pb

    def busy(self, v: ReplicaView, cls: TrafficClass) -> bool:
        """What the class waits for on that replica is past its bound (over a limit is busy too). A chat: behind a
        document its predicted TTFT is over the target, or `busy_pending_requests` wait for a first token; a
        document: `busy_prefill_tokens` uncached tokens wait."""
        if not self.admits(v):
            return True
        load = self.loads[v.replica_id]
        if cls is TrafficClass.LONG:
            return load.prefill_tokens >= self.knobs.busy_prefill_tokens
        return self.over_target(v) or load.num_pending >= self.knobs.busy_pending_requests

    def behind_document(self, v: ReplicaView) -> bool:
        """More than a chat's worth of prefill is queued on `v`: a document (or several) is ahead of a chat there.
        A queue of chats alone is no reason to move: every replica gets chats, and a published load up to a stats
        period old still counts this router's last sends there."""
        return self.loads[v.replica_id].prefill_tokens > self.short_request_tokens

    def over_target(self, v: ReplicaView) -> bool:
        """Behind a document, this request's first token is predicted past the engines' TTFT target."""
        predicted = self.predicted_ttft_s(v)
        return predicted is not None and predicted > self.ttft_target_s and self.behind_document(v)

    def keeps_chat_slo(self, v: ReplicaView) -> bool:
        """With this request on `v`, a chat (of `chat_tokens`) still meets the TTFT target on some replica chats may
        use. Replicas without a published rate count as meeting it (nothing says otherwise)."""
        if v.replica_id not in self._keeps:
            added = self.uncached_tokens(v)
            probe = self.chat_tokens
            keeps = False
            for s in self.usable:
                if s.lane is Lane.LONG or not self.admits(s):
                    continue
                load = self.loads[s.replica_id]
                predicted = predict_ttft_s(with_request(load, added) if s is v else load, probe)
                if predicted is None or predicted <= self.ttft_target_s:
                    keeps = True
                    break
            self._keeps[v.replica_id] = keeps
        return self._keeps[v.replica_id]

    def home(self, v: ReplicaView, cls: TrafficClass) -> bool:
        """The class's own lane (or the other one when its own has no replica)."""
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
        """A document: where chats keep their SLO first, then not busy, its own lane, soonest drained. A chat: not
        busy, its own lane, lowest predicted TTFT. Counts break ties (and decide when no rate is published)."""

        def key(v: ReplicaView) -> tuple[bool, bool, bool, tuple[float, int, int, int], str]:
            cls = self.traffic_class(v)
            load = self.loads[v.replica_id]
            if cls is TrafficClass.LONG:
                drain = _or_inf(prefill_drain_s(load, self.uncached_tokens(v)))
                return (
                    not self.keeps_chat_slo(v),
                    self.busy(v, cls),
                    not self.home(v, cls),
                    (drain, load.prefill_tokens, load.num_pending, load.num_decoding),
                    v.replica_id,
                )
            by_load = (_or_inf(self.predicted_ttft_s(v)), load.num_pending, load.num_decoding, load.prefill_tokens)
            return (False, self.busy(v, cls), not self.home(v, cls), by_load, v.replica_id)

        chosen = min(candidates, key=key)
        cls = self.traffic_class(chosen)
        mismatched = chosen.lane is not Lane.BOTH and (chosen.lane is Lane.LONG) != (cls is TrafficClass.LONG)
        if mismatched and reason is not RouteReason.GAVE_WAY:
            # Outside its own lane: a chat spilled to a saturated chat lane's neighbour, or the lane is missing.
            reason = RouteReason.NO_LANE if self.home(chosen, cls) else RouteReason.SPILL
        return self.decision(chosen, reason)

    def pinned_document(self, pinned: ReplicaView, takers: Sequence[ReplicaView]) -> RouteDecision | Shed:
        """A document even on the replica its prefix (or its named session) pins it to: what the pin saves is in
        each replica's uncached tokens already, so it goes where it drains soonest, as any document does (`best`);
        `gave-way` where that is another replica."""
        chosen = self.best_admitting([pinned, *(v for v in takers if v is not pinned)], RouteReason.AFFINITY)
        moved = isinstance(chosen, RouteDecision) and chosen.replica_id != pinned.replica_id
        if moved and chosen.reason is RouteReason.AFFINITY:
            return replace(chosen, reason=RouteReason.GAVE_WAY)
        return chosen

    def best_admitting(self, candidates: Sequence[ReplicaView], reason: RouteReason) -> RouteDecision | Shed:
        """The best of the candidates under their limits; a shed when there is none."""
        admitting = [v for v in candidates if self.admits(v)]
        return self.best(admitting, reason) if admitting else self.shed(candidates)

    def shed(self, over: Sequence[ReplicaView]) -> Shed:
        """Every allowed replica is over a limit: the answer the most lenient of them would give."""
        verdicts = {v.replica_id: self.verdicts[v.replica_id] for v in over}
        return shed_of(verdicts, {v.replica_id: v.limits or BackpressureLimits() for v in over})

    def decision(self, v: ReplicaView, reason: RouteReason) -> RouteDecision:
        cls = self.traffic_class(v)
        lane = serving_lane(v.lane, cls)
        return RouteDecision(
            v.replica_id, lane, cls, reason, self.uncached_tokens(v), self.hint.session_id, v.slo_for(cls)
        )
