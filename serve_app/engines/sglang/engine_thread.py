"""A thread that owns the event loop an in-process `sglang.Engine` is built on and always called on.

sglang's tokenizer manager binds its handle loop to the loop current where the engine is built; driven
from another loop it can hang without an error (`docs`: SGLANG_ON_CPU.md, traps). The replica's own
loop stays free for Serve (health checks, routing stats): every engine call is a coroutine sent to this
thread's loop, and streams come back through a queue on the caller's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

_END = object()


class EngineThread:
    """One daemon thread running one event loop; `build` runs there first (it may block for the engine's start)."""

    def __init__(self, name: str = "sglang-engine-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def build(self, factory: Callable[[], T]) -> T:
        """Call `factory()` on the loop's thread with the loop current (sglang picks it up as `engine.loop`)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def call() -> None:
            try:
                future.set_result(factory())
            except BaseException as e:  # handed to the awaiting caller
                future.set_exception(e)

        self.loop.call_soon_threadsafe(call)
        return await asyncio.wrap_future(future)

    async def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Await `make()` on the engine's loop; cancelling the caller cancels it there."""
        future = asyncio.run_coroutine_threadsafe(_awaited(make), self.loop)
        try:
            return await asyncio.wrap_future(future)
        finally:
            future.cancel()

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run a plain function on the engine's loop (fire and forget: aborts)."""
        self.loop.call_soon_threadsafe(fn, *args)

    async def stream(self, make: Callable[[], AsyncIterator[T]]) -> AsyncIterator[T]:
        """Iterate `make()` on the engine's loop, yielding its items on the caller's loop. Closing or cancelling the
        consumer cancels the producer (its `finally` blocks run on the engine's loop)."""
        async with contextlib.aclosing(self.batches(make)) as batches:
            async for batch in batches:
                for item in batch:
                    yield item

    async def batches(self, make: Callable[[], AsyncIterator[T]]) -> AsyncGenerator[list[T], None]:
        """As `stream`, but each step yields every item produced since the consumer last looked: a consumer that
        forwards them (one Serve stream item per batch) keeps up with a fast producer with fewer, larger items."""
        caller = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()

        def put(item: Any) -> None:
            caller.call_soon_threadsafe(queue.put_nowait, item)

        async def pump() -> None:
            try:
                async for item in make():
                    put(item)
            except BaseException as e:
                put(_Failure(e))
                return
            put(_END)

        future = asyncio.run_coroutine_threadsafe(pump(), self.loop)
        try:
            while True:
                ready = [await queue.get()]
                while not queue.empty():
                    ready.append(queue.get_nowait())
                batch: list[T] = []
                for item in ready:
                    if item is _END or isinstance(item, _Failure):
                        if batch:
                            yield batch
                        if isinstance(item, _Failure):
                            raise item.error
                        return
                    batch.append(item)
                yield batch
        finally:
            future.cancel()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


async def _awaited(make: Callable[[], Awaitable[T]]) -> T:
    return await make()
