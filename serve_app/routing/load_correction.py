"""A replica's published load, corrected by what this router knows happened since it was published.

Replicas publish their loads once a stats period (0.5 s in our configs); a router routes many requests in between.
Requests it sent since (or just before: they may not have arrived) count as waiting; requests of its own that the
load counted and that have ended since count no longer, pending or decoding: a replica predicted to run a decode pass
that is not coming looks slower than it is for up to a stats period.

A published load counts decoding requests as of the replica's last engine reading (every 0.25 s while busy), a
little before its publication: a request that was sent, got its first token and stayed open between the two is not in
it, and when it ends the count is taken down by one it never had (never below zero).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, replace
from itertools import takewhile

from serve_app.replica.backend import ReplicaLoad
from serve_app.routing.records import ARRIVAL_MARGIN_S, ReplicaView
from serve_app.routing.ttft_prediction import pass_s


@dataclass(frozen=True, slots=True)
class InFlight:
    """A request this router sent, as it sent it."""

    replica_id: str
    request_id: str | None
    session_id: str | None
    prompt_tokens: int
    uncached_tokens: int
    decided_s: float
    short: bool
    prefix_pages: tuple[int, ...]
    tenant: str


Completed = OrderedDict[str, tuple[InFlight, float]]
"""This router's requests that ended lately, by engine request id, with when, in the order they ended."""


def corrected_load(
    view: ReplicaView, in_flight: Collection[InFlight], completed: Completed, now_s: float | None = None
) -> ReplicaLoad:
    """`view`'s published load, less this router's requests that have ended since and with those it sent since. With
    `now_s`, the pass a new arrival waits for is the interactive one where this router has a short request running
    (`_pass_in_flight`)."""
    return _pass_in_flight(view.replica_id, _counted(view, in_flight, completed), in_flight, now_s)


def _pass_in_flight(
    replica_id: str, load: ReplicaLoad, in_flight: Collection[InFlight], now_s: float | None
) -> ReplicaLoad:
    """An engine with adaptive passes runs interactive passes while a short request is pending or decoding
    there. Once one of this router's short requests has been there longer than a quiet pass, the pass in
    flight is an interactive one (before that it may still be the quiet pass it arrived during)."""
    if now_s is None or load.prefill_tok_per_s <= 0 or not 0 < load.interactive_pass_tokens < load.pass_tokens:
        return load
    settled_s = now_s - pass_s(load, load.pass_tokens)
    if any(e.short and e.replica_id == replica_id and e.decided_s <= settled_s for e in in_flight):
        return replace(load, pass_tokens=load.interactive_pass_tokens)
    return load


def _counted(view: ReplicaView, in_flight: Collection[InFlight], completed: Completed) -> ReplicaLoad:
    gone = [rid for rid in view.pending if rid in completed]
    sent = [
        e
        for e in in_flight
        if e.replica_id == view.replica_id
        and e.decided_s > view.stats_time_s - ARRIVAL_MARGIN_S
        and e.request_id not in view.pending
    ]
    ended = _ended_decoding(view, completed)
    if not gone and not sent and not ended:
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
        num_decoding=max(0, view.load.num_decoding - ended),
        prefill_tokens=max(
            0, view.load.prefill_tokens - sum(view.pending[r] for r in gone) + sum(e.uncached_tokens for e in sent)
        ),
    )


def _ended_decoding(view: ReplicaView, completed: Completed) -> int:
    """This router's requests that `view`'s load counted as decoding and that ended since it was published: sent
    before it by more than the arrival margin, not pending in it, ended after it."""
    if not view.load.num_decoding:
        return 0
    since = takewhile(lambda done: done[1] > view.stats_time_s, reversed(completed.values()))
    cutoff = view.stats_time_s - ARRIVAL_MARGIN_S
    return sum(
        e.replica_id == view.replica_id and e.decided_s <= cutoff and e.request_id not in view.pending for e, _ in since
    )
