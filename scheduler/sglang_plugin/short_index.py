"""The short waiting requests of sglang's queue, in queue order, kept up to date without rescanning the queue.

sglang's scan walks ``waiting_queue`` in order and the planner judges at most `lookahead` requests past a
rejection, so a question queued behind many documents would never be looked at. The planner also takes an
index of short waiting requests (`QueueSnapshot.waiting_short`, as the simulator gives it); this is the
plugin's. Its work per pass is bounded by what changed: a pass indexes only the requests that joined the queue
since the last (`queue_tail`); the index is rebuilt (one pass over the queue) when sglang replaced the list (after
every admission, which costs upstream a pass over the queue too), removed requests from it (an abort), or may have
reordered it (any order but FCFS, which sorts the queue every pass anyway).

A request counts here when its whole prompt is short: its uncached prompt can only be smaller. One that is long
but mostly cached is still found by the ordinary scan, as upstream finds it.
"""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING

from scheduler.config import PolicyConfig
from scheduler.sglang_plugin.queue_tail import QueueTail

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req


class ShortIndex:
    def __init__(self) -> None:
        self.reqs: list[Req] = []
        """The indexed short requests, in queue order."""
        self.version = 0
        """Changes whenever `reqs` does (a scan reused across passes must see the same index)."""
        self._tail = QueueTail()
        self._threshold: int | None = None

    def refresh(self, queue: list[Req], cfg: PolicyConfig, in_order: bool) -> None:
        """Bring the index up to `queue`; `in_order`: sglang keeps the queue in arrival order (FCFS)."""
        same_threshold = cfg.short_request_tokens == self._threshold
        restart, start = self._tail.read_from(queue, in_order and same_threshold)
        if restart:
            self._threshold = cfg.short_request_tokens
            self.reqs = []
            self.version += 1
        if len(queue) > start:
            self.reqs.extend(r for r in islice(queue, start, None) if short_prompt(r, cfg))
            self.version += 1

    def invalidate(self) -> None:
        """The plugin reordered the queue itself: rebuild on the next refresh."""
        self._tail.invalidate()


def short_prompt(req: Req, cfg: PolicyConfig) -> bool:
    return cfg.is_short(len(req.origin_input_ids))
