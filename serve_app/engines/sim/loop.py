"""The engine loop of one replica in real time: schedule -> execute -> update.

`engine.step(now)` decides and books a pass; the task sleeps until the pass ends, its simulated duration times
`time_scale` after the pass before it ended (a pass in flight cannot be interrupted, as on a GPU), then hands the
tokens of that pass to the streams. With nothing to run it waits for an arrival or an abort (`wake`).

How late each pass with prefill still ends against its cost is the replica's stated error (`WallClockCost`). The
simulated engine charges each pass exactly its preset's cost, so offline its passes run as predicted and the SLO
sizer may plan them right up to a target. A replica runs them in wall time on a shared machine: a pass ends when
its task wakes, up to milliseconds late, and a chat's gap between tokens is then a little over a pass sized to the
time-between-tokens target (`benchmarks.autoscale_ramp` saw it). So the replica states the error its own passes
show, by the rule the plugin's online fit states its error by (`scheduler.pass_cost.Overruns`), and the sizer
charges every predicted pass with it. Time scaled to 0 runs no pass in wall time and states no error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

from scheduler.interleave import PassKind
from scheduler.pass_cost import Overruns, PassCost
from scheduler.pass_cost_fit import FitSettings
from scheduler.sim.engine import SimEngine
from serve_app.engines.sim.streams import Streams

MIN_SLEEP_S = 0.001
"""Passes are slept in real time once they add up to this (below it, timers are not precise anyway)."""
MAX_BUSY_S = 0.002
"""With near-zero pass costs, the loop still yields this often."""
MAX_CATCH_UP_S = 0.05
"""A pass starts when the one before it ended, or this long ago at the earliest: a late wake-up is absorbed, a
stall longer than this is time the engine lost."""
FIT = FitSettings()
"""The window and minimum count of the plugin's fit, which the replica's stated error keeps too."""


class WallClockCost:
    """The preset's pass cost as the replica runs it in wall time: its predictions, and the error its passes show
    against them (the module docstring)."""

    def __init__(self, preset: PassCost, overrun_quantile: float) -> None:
        self.preset = preset
        self.overruns = Overruns(FIT.error_window_passes, FIT.error_min_passes, overrun_quantile, prior=0.0)
        """How the replica's latest passes with prefill ran in wall time against their predictions."""

    def pass_s(self, prefill_tokens: int, prefill_ctx_pairs: float, decode_rows: int, decode_ctx_tokens: int) -> float:
        return self.preset.pass_s(prefill_tokens, prefill_ctx_pairs, decode_rows, decode_ctx_tokens)

    @property
    def relative_error(self) -> float:
        return self.overruns.stated


class EngineLoop:
    def __init__(
        self, engine: SimEngine, streams: Streams, time_scale: float, overruns: Overruns | None = None
    ) -> None:
        self.engine = engine
        self.streams = streams
        self.time_scale = time_scale
        self.overruns = overruns
        """Where each pass with prefill that ran alone in wall time is timed against its cost (`WallClockCost`)."""
        self.num_passes_by_kind: Counter[str] = Counter()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._wake = asyncio.Event()  # bound to the running loop
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def wake(self) -> None:
        """Something changed that may let a pass run (an arrival, an abort)."""
        self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        end_s: float | None = None  # when the passes booked so far end, in wall time; None after idling
        last_yield_s = loop.time()
        while True:
            if self.engine.idle:
                await self._wait_for_work()
                end_s, last_yield_s = None, loop.time()
                continue
            now = loop.time()
            res = self.engine.step(now)
            if res.kind is PassKind.IDLE:
                # Requests wait but none can be admitted now (KV or slots): an arrival or abort changes that.
                await self._wait_for_work()
                end_s, last_yield_s = None, loop.time()
                continue
            self.num_passes_by_kind[res.kind.value] += 1
            # The pass is in flight: arrivals in the meantime are scheduled in the next pass. It starts when the one
            # before it ended, as on a GPU, not when this task woke up to see that end: the time this process took
            # to wake and plan (a loaded machine, a long prompt hashed on this loop) is not added to every pass.
            start_s = now if end_s is None else max(end_s, now - MAX_CATCH_UP_S)
            pass_s = res.duration_s * self.time_scale
            end_s = start_s + pass_s
            wait_s = end_s - loop.time()
            if wait_s >= MIN_SLEEP_S:
                await asyncio.sleep(wait_s)
                last_yield_s = loop.time()
            elif loop.time() - last_yield_s >= MAX_BUSY_S:
                await asyncio.sleep(0)  # near-zero-cost passes: still let arrivals and streams run
                last_yield_s = loop.time()
            if self.overruns is not None and res.num_prefill_tokens and pass_s >= MIN_SLEEP_S:
                self.overruns.add(loop.time() - start_s, pass_s)
            self.streams.deliver(res)

    async def _wait_for_work(self) -> None:
        self._wake.clear()
        await self._wake.wait()
