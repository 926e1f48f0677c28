"""An sglang engine's load snapshots as the `ReplicaLoad` routers read: counts, and the prefill rate.

The rate is measured from its cumulative prefill counters (uncached tokens per second of prefill work).
sglang's scheduler counts, in every load snapshot, the uncached tokens its prefill passes took
(`total_prefill_uncached_tokens`) and the time those passes ran (`total_prefill_busy_us`, per-pass overhead
included). The rate over the last `window_s` is what a replica publishes to routers; until enough tokens have
been prefilled to measure it (a fresh engine), it publishes none (0): the router then gives it the rate its peers
measured, and where none has (every engine fresh) places by counts (`serve_app.routing.ttft_prediction`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler.config import PolicyConfig
from serve_app.replica.backend import ReplicaLoad
from serve_app.routing.ttft_prediction import (
    interactive_pass_tokens,
    overtakes_queued_prefill,
    wait_pass_seconds,
    wait_pass_tokens,
)

WINDOW_S = 60.0
MIN_MEASURED_TOKENS = 2048
"""Fewer prefilled tokens than this in the window measure too little (a few short passes): keep what was known."""


@dataclass
class PrefillRate:
    window_s: float = WINDOW_S
    min_tokens: int = MIN_MEASURED_TOKENS
    _samples: deque[tuple[float, int, int]] = field(default_factory=deque)
    _measured: float = 0.0

    def observe(self, now_s: float, total_tokens: int, total_busy_us: int) -> None:
        """One reading of the cumulative counters."""
        if self._samples and total_tokens < self._samples[-1][1]:
            self._samples.clear()  # the engine restarted: its counters did too
        self._samples.append((now_s, total_tokens, total_busy_us))
        while len(self._samples) > 2 and now_s - self._samples[1][0] >= self.window_s:
            self._samples.popleft()
        _, tokens0, busy0 = self._samples[0]
        tokens, busy_us = total_tokens - tokens0, total_busy_us - busy0
        if tokens >= self.min_tokens and busy_us > 0:
            self._measured = tokens / (busy_us / 1e6)

    @property
    def tok_per_s(self) -> float:
        """The measured rate; 0 (none) until there is one. A guessed rate would be a guess about the device: a
        low one made every fresh engine predict a chat's wait behind a document past the TTFT target, so the
        router kept one replica free for chats and the first documents all went to the other."""
        return self._measured


@dataclass
class PendingPrefill:
    """Requests this replica sent its engine that have no first token yet: id -> uncached tokens (estimated).

    sglang's snapshots count only its waiting queue: the request it is prefilling in chunks (a document, for
    seconds) is in no count. The replica's own record covers it."""

    tokens_by_rid: dict[str, int] = field(default_factory=dict)

    def sent(self, rid: str, uncached_tokens: int) -> None:
        self.tokens_by_rid[rid] = max(1, uncached_tokens)

    def answered(self, rid: str) -> bool:
        """Whether `rid` was pending (it is not now)."""
        return self.tokens_by_rid.pop(rid, None) is not None

    def ids(self, limit: int) -> dict[str, int]:
        return dict(list(self.tokens_by_rid.items())[:limit])


def reported_wait_pass_s(states: Sequence[Mapping[str, Any] | None]) -> float | None:
    """The wait bound the plugin reports (``wait_pass_s`` in its state: its SLO sizer's own, on its online fit and
    this engine's lags), the longest of its schedulers'; None before any has reported one."""
    reported = [
        s["wait_pass_s"] for s in states if isinstance(s, Mapping) and isinstance(s.get("wait_pass_s"), float | int)
    ]
    return float(max(reported)) if reported else None


def replica_load(
    snaps: Sequence[Any],
    rate: PrefillRate,
    now_s: float,
    policy: PolicyConfig,
    chunk_budget_tokens: int,
    pending: PendingPrefill | None = None,
    plugin_states: Sequence[Mapping[str, Any] | None] = (),
) -> ReplicaLoad:
    """The load of an engine from its schedulers' `LoadSnapshot`s (one per data-parallel rank) and the replica's
    `pending` requests; `rate` observes their prefill counters. sglang's busy time includes each pass's
    overhead, so no separate fixed cost. `plugin_states`: the plugin's state in each scheduler (``fairshare`` in
    sglang's internal state), whose wait bound the load carries; until the plugin has reported one,
    `wait_pass_seconds` without the engine's figures."""
    rate.observe(
        now_s,
        sum(getattr(s, "total_prefill_uncached_tokens", 0) for s in snaps),
        sum(getattr(s, "total_prefill_busy_us", 0) for s in snaps),
    )
    return recounted_load(snaps, rate, policy, chunk_budget_tokens, pending, plugin_states)


def recounted_load(
    snaps: Sequence[Any],
    rate: PrefillRate,
    policy: PolicyConfig,
    chunk_budget_tokens: int,
    pending: PendingPrefill | None = None,
    plugin_states: Sequence[Mapping[str, Any] | None] = (),
) -> ReplicaLoad:
    """`replica_load` of the last snapshots, with no new reading of the counters: the engine's figures as last read,
    the replica's `pending` requests as they are now (a request that has just come counts at once, before the
    engine is read again; one answered since counts no longer, as waiting or as queued tokens)."""
    wait_s = reported_wait_pass_s(plugin_states)
    read_waiting = sum(s.num_waiting_reqs for s in snaps)
    queued_tokens = sum(s.num_waiting_uncached_tokens for s in snaps)
    in_flight = pending.tokens_by_rid if pending is not None else {}
    waiting = read_waiting
    if pending is not None and read_waiting > len(in_flight):
        # Every request in the engine's queue is one this replica still has pending: a reading taken before some
        # were answered counts them until the next, and routers would count a wait there that is not coming.
        waiting, queued_tokens = len(in_flight), 0
    return ReplicaLoad(
        num_waiting=waiting,
        num_prefilling=max(0, len(in_flight) - waiting),
        num_decoding=max(0, sum(s.num_running_reqs for s in snaps) - max(0, len(in_flight) - waiting)),
        prefill_tokens=max(queued_tokens, sum(in_flight.values())),
        max_running_requests=sum(s.max_running_requests for s in snaps),
        kv_used_tokens=sum(s.num_used_tokens for s in snaps),
        kv_total_tokens=sum(s.max_total_num_tokens for s in snaps),
        prefill_tok_per_s=rate.tok_per_s,
        pass_tokens=wait_pass_tokens(policy, chunk_budget_tokens),
        wait_pass_s=wait_pass_seconds(policy) if wait_s is None else wait_s,
        interactive_pass_tokens=interactive_pass_tokens(policy, chunk_budget_tokens),
        short_first=overtakes_queued_prefill(policy),
    )


@dataclass
class EngineReading:
    """The replica's count of its engine's load: the last reading of the schedulers' snapshots (`read`), recounted
    with the replica's own pending requests as they are now (`recount`): a request counts from the moment it reaches
    the replica, before the engine is read again."""

    rate: PrefillRate = field(default_factory=PrefillRate)
    pending: PendingPrefill = field(default_factory=PendingPrefill)
    _last: tuple[list[Any], PolicyConfig, int, list[Any]] | None = None

    def read(
        self, snaps: Sequence[Any], now_s: float, policy: PolicyConfig, chunk_budget_tokens: int, states: Sequence[Any]
    ) -> ReplicaLoad:
        """`replica_load` of a new reading (`states`: the plugin's, as `plugin_states`)."""
        self._last = (list(snaps), policy, chunk_budget_tokens, list(states))
        return replica_load(snaps, self.rate, now_s, policy, chunk_budget_tokens, self.pending, states)

    def sent(self, rid: str, uncached_tokens: int) -> ReplicaLoad | None:
        """The load with `rid` pending from now (None before any reading)."""
        self.pending.sent(rid, uncached_tokens)
        return self.recount()

    def answered(self, rid: str) -> ReplicaLoad | None:
        """The load with `rid` no longer pending (None where that changed nothing)."""
        return self.recount() if self.pending.answered(rid) else None

    def recount(self) -> ReplicaLoad | None:
        """`recounted_load` of the last reading; None before any (or after `forget`)."""
        if self._last is None:
            return None
        snaps, policy, chunk_budget_tokens, states = self._last
        return recounted_load(snaps, self.rate, policy, chunk_budget_tokens, self.pending, states)

    def forget(self) -> None:
        """The engine stopped: its last reading no longer stands."""
        self._last = None
