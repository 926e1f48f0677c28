"""A response's stream items spaced in time: what an engine writes faster than `spacing_s` goes on as fewer items.

Every stream item crosses the engine replica, the ingress and Serve's proxy, one Ray streaming call a hop, and
that per-item CPU is most of what the Serve stack costs under streaming load (up to an item a token).
An engine decoding alone writes a token every few milliseconds; a client reading text sees no difference
between a token now and one 50 ms later. So: items go on at once until one carries output (the first token is
the time to first token, never held); after that, items are at least `spacing_s` apart, each holding what was
written since the last. A part is held at most `spacing_s`; the stream's end (or its failure) goes on at once,
with what was held before it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


async def paced(
    source: AsyncGenerator[Sequence[T], None], spacing_s: float, starts: Callable[[Sequence[T]], bool]
) -> AsyncGenerator[list[T], None]:
    """`source`'s batches in order and whole, joined so that the ones after the first batch for which
    `starts(batch)` holds go on at least `spacing_s` apart. Closing this closes `source`."""
    if spacing_s <= 0:
        async with contextlib.aclosing(source):
            async for batch in source:
                yield list(batch)
        return
    loop = asyncio.get_running_loop()
    held: list[T] = []
    due: float | None = None
    """When the next batch may go on; None until a batch that starts the spacing went on."""
    step: asyncio.Future[Sequence[T]] = asyncio.ensure_future(anext(source))
    try:
        while True:
            timeout = max(0.0, due - loop.time()) if due is not None and held else None
            done, _ = await asyncio.wait({step}, timeout=timeout)
            if step in done:
                try:
                    held += step.result()
                except StopAsyncIteration:
                    break
                except BaseException:
                    if held:
                        yield held
                    raise
                step = asyncio.ensure_future(anext(source))
                if due is not None and loop.time() < due:
                    continue
            out, held = held, []
            yield out
            if due is not None or starts(out):
                due = loop.time() + spacing_s
        if held:
            yield held
    finally:
        step.cancel()
        with contextlib.suppress(BaseException):
            await step
        await source.aclose()
