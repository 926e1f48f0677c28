"""From the engine loop to each request's stream: token counts per pass, the end, or an abort from outside.

The loop delivers a pass's results without waiting for readers; a reader takes everything delivered
since it last looked, so a slow reader gets coalesced chunks instead of a growing backlog of items.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from scheduler.sim.engine import StepResult

_FINISHED = None
_ABORTED = -1


@dataclass(frozen=True, slots=True)
class Progress:
    """What happened to one request since its reader last looked."""

    num_generated: int | None
    """Tokens generated so far (None: no new token)."""
    finished: bool = False
    aborted: bool = False
    """Aborted from outside its stream (`SimBackend.abort`)."""


class Streams:
    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue[int | None]] = {}

    def __contains__(self, rid: str) -> bool:
        return rid in self._queues

    def open(self, rid: str) -> asyncio.Queue[int | None]:
        """A new stream; its reader keeps the queue, so an abort that forgets the stream still reaches it."""
        queue: asyncio.Queue[int | None] = asyncio.Queue()
        self._queues[rid] = queue
        return queue

    def close(self, rid: str) -> bool:
        """Forget a stream; False if it was not open."""
        return self._queues.pop(rid, None) is not None

    def abort(self, rid: str) -> None:
        queue = self._queues.pop(rid, None)
        if queue is not None:
            queue.put_nowait(_ABORTED)

    def deliver(self, res: StepResult) -> None:
        for rid, num_generated in res.emitted:
            if rid in self._queues:
                self._queues[rid].put_nowait(num_generated)
        for rid in res.finished:
            if rid in self._queues:
                self._queues[rid].put_nowait(_FINISHED)


async def next_progress(queue: asyncio.Queue[int | None]) -> Progress:
    """Wait for news on a stream, then take all of it."""
    batch = [await queue.get()]
    while not queue.empty():
        batch.append(queue.get_nowait())
    if _ABORTED in batch:
        return Progress(None, aborted=True)
    counts = [n for n in batch if n is not None]
    return Progress(max(counts) if counts else None, finished=_FINISHED in batch)
