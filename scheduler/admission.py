"""Skip-ahead admission: when a waiting request is rejected for KV capacity, may the scan go on?

Upstream sglang stops the scan at the first capacity rejection, so a 30-token question queued
behind a 70k-token document is never examined even with 68k tokens free (seed 000: 109.7 s).
Skipping ahead fixes that but gives up strict FCFS, so it is switchable, bounded, and guarded
against starving the big request: once it has been skipped in `max_skipped_passes` passes it holds
a reservation, and no later *long* request may overtake it. Short requests still may: their KV
footprint is bounded (at most `max_running_requests` of `short_request_tokens` each) and brief, so
they cannot keep the memory it waits for from freeing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.config import PolicyConfig


@dataclass
class StarvationLedger:
    """Passes in which each waiting request was skipped for capacity. Lives across passes."""

    skipped_passes: dict[str, int] = field(default_factory=dict)
    max_entries: int = 4096

    def record_skip(self, rid: str) -> int:
        self.skipped_passes[rid] = self.skipped_passes.get(rid, 0) + 1
        return self.skipped_passes[rid]

    def is_reserved(self, rid: str, cfg: PolicyConfig) -> bool:
        return self.skipped_passes.get(rid, 0) >= cfg.max_skipped_passes

    def forget(self, rid: str) -> None:
        self.skipped_passes.pop(rid, None)

    def prune(self, alive_rids: set[str]) -> None:
        """Drop requests that left the queue without being admitted (aborts). Called rarely."""
        if len(self.skipped_passes) > self.max_entries:
            self.skipped_passes = {r: n for r, n in self.skipped_passes.items() if r in alive_rids}


class AdmissionScan:
    """One pass over the waiting queue; decides when the scan stops."""

    def __init__(self, cfg: PolicyConfig, ledger: StarvationLedger) -> None:
        self._cfg = cfg
        self._ledger = ledger
        self._rejected = False
        self._reserved_ahead = False
        self._num_examined_after_rejection = 0
        self.num_skipped = 0

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
        if self._ledger.is_reserved(rid, self._cfg):
            self._reserved_ahead = True
        else:
            self._ledger.record_skip(rid)
        self._rejected = True
        self.num_skipped += 1
        return True

    def may_overtake(self, extend_tokens: int) -> bool:
        """May a request that fits be admitted past the requests rejected before it?"""
        return not self._reserved_ahead or self._cfg.is_short(extend_tokens)

    def on_admitted(self, rid: str) -> None:
        self._ledger.forget(rid)
