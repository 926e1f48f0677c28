"""Skip-ahead admission: when a waiting request is rejected for KV capacity, may the scan go on?

Upstream sglang stops the scan at the first capacity rejection, so a 30-token question queued
behind a 70k-token document is never examined even with 68k tokens free (the article: 109.7 s).
Skipping ahead fixes that but gives up strict FCFS, so it is switchable, bounded, and guarded
against starving the big request: once it has waited `max_skipped_passes` forward passes since it
was first skipped it holds a reservation, and no later *long* request may overtake it. Short
requests still may: their KV footprint is bounded (at most `max_running_requests` of
`short_request_tokens` each) and brief, so they cannot keep the memory it waits for from freeing.

The interactive reserve (`reserved_slots`, `reserved_kv_tokens`) is the other half: a long request
is admitted only if it leaves the reserve free, so documents can never hold every running slot or
all free KV while a short request waits. Alone on an idle engine a long request may use it all
(otherwise one bigger than the pool less the reserve could never run).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.config import PolicyConfig
from scheduler.snapshot import Rejection


@dataclass
class StarvationLedger:
    """The forward pass in which each waiting request was first skipped for capacity. Lives across passes."""

    first_skipped: dict[str, int] = field(default_factory=dict)
    max_entries: int = 4096
    _removals: int = 0
    """Entries dropped since start: a list recorded before is recorded in full again only after one."""
    _recorded: tuple[Sequence[Rejection], int] | None = None
    """The rejections last recorded and `_removals` then: an engine replays an idle pass's list every iteration."""

    def record_skip(self, rid: str, pass_index: int) -> None:
        """Idempotent within a pass: the planner may scan a pass more than once."""
        self.first_skipped.setdefault(rid, pass_index)

    def record_skips(self, rejections: Sequence[Rejection], pass_index: int) -> None:
        """`record_skip` for each skipped rejection. Recording is idempotent, so the same list recorded again
        with no entry dropped since changes nothing and is not walked."""
        last = self._recorded
        if last is not None and last[0] is rejections and last[1] == self._removals:
            return
        for r in rejections:
            if r.skipped:
                self.first_skipped.setdefault(r.rid, pass_index)
        self._recorded = (rejections, self._removals)

    def is_reserved(self, rid: str, cfg: PolicyConfig, pass_index: int) -> bool:
        first = self.first_skipped.get(rid)
        return first is not None and pass_index - first >= cfg.max_skipped_passes

    def forget(self, rid: str) -> None:
        if self.first_skipped.pop(rid, None) is not None:
            self._removals += 1

    def prune(self, alive_rids: set[str]) -> None:
        """Drop requests that left the queue without being admitted (aborts). Called rarely."""
        if len(self.first_skipped) > self.max_entries:
            self.first_skipped = {r: n for r, n in self.first_skipped.items() if r in alive_rids}
            self._removals += 1


class AdmissionScan:
    """One walk over the waiting queue; decides when it stops. Reads the ledger, never writes it."""

    def __init__(self, cfg: PolicyConfig, ledger: StarvationLedger, pass_index: int) -> None:
        self._cfg = cfg
        self._ledger = ledger
        self._pass_index = pass_index
        self._rejected = False
        self._reserved_ahead = False
        self._num_examined_after_rejection = 0

    def may_examine_next(self) -> bool:
        """Called before each candidate. After a rejection only `lookahead` more are examined."""
        if not self._rejected:
            return True
        if self._num_examined_after_rejection >= self._cfg.lookahead:
            return False
        self._num_examined_after_rejection += 1
        return True

    def on_capacity_rejection(self, rid: str) -> bool:
        """Record a rejection; True when the scan goes on past this request."""
        if not self._cfg.skip_ahead:
            return False  # strict FCFS: upstream sglang breaks here
        if self._ledger.is_reserved(rid, self._cfg, self._pass_index):
            self._reserved_ahead = True
        self._rejected = True
        return True

    def may_overtake(self, short: bool) -> bool:
        """May a request that fits be admitted past the requests rejected before it? `short`: it is short
        (`PolicyConfig.is_short` of its prefill)."""
        return not self._reserved_ahead or short


def fits(cfg: PolicyConfig, short: bool, need_tokens: int, free_kv: int, free_slots: int, engine_idle: bool) -> bool:
    """Does a request fit in what is free? A long one must leave the interactive reserve, unless the
    engine holds nothing else (it could never run otherwise). `short`: `PolicyConfig.is_short` of its prefill."""
    return free_kv >= free_kv_to_fit(cfg, short, need_tokens, free_slots, engine_idle)


def free_kv_to_fit(cfg: PolicyConfig, short: bool, need_tokens: int, free_slots: int, engine_idle: bool) -> int | float:
    """The least free KV with which the request fits, given the free slots (infinite when the slots alone
    refuse it); `short`: `PolicyConfig.is_short` of its prefill (callers classify a request once). Engines that
    skip a scan while free KV stays below this (the plugin's idle scan) rely on it being the exact threshold of
    `fits`."""
    if free_slots <= 0:
        return math.inf
    if short or engine_idle:
        return need_tokens
    return need_tokens + cfg.reserved_kv_tokens if free_slots > cfg.reserved_slots else math.inf
