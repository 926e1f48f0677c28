"""Where an index of sglang's waiting queue left off, so that a pass reads only the requests that joined it since.

sglang appends arrivals to the same ``waiting_queue`` list, builds a new list after every admission (which costs
upstream a pass over the queue too) and removes an aborted request in place. An index that read the queue up to its
last request may read on from there while the list is the same object, no shorter, and still holds that request
where it was read (a removal before it shifts it left); otherwise it reads the whole queue again. Only in a queue
kept in arrival order: a sort can move a request that joined after the index read into the part it had read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req


class QueueTail:
    def __init__(self) -> None:
        self._queue: list[Req] | None = None
        self._num_read = 0
        self._last: Req | None = None

    def read_from(self, queue: list[Req], in_order: bool = True) -> tuple[bool, int]:
        """Mark all of `queue` read; returns whether the index must start over (with the requests read before
        dropped) and where the requests it has not read begin. `in_order`: sglang keeps the queue in arrival order."""
        n = self._num_read
        goes_on = in_order and queue is self._queue and len(queue) >= n and (n == 0 or queue[n - 1] is self._last)
        if not goes_on:
            self._queue, n = queue, 0
        self._num_read = len(queue)
        self._last = queue[-1] if queue else None
        return not goes_on, n

    def invalidate(self) -> None:
        """The queue was reordered behind the index's back (the plugin moved requests): start over at the next read."""
        self._queue = None
