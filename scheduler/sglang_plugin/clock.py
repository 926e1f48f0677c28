"""The plugin's own time per scheduler pass, measured inside the scheduler process (off by default).

With ``FAIRSHARE_PLUGIN_CLOCK=FILE`` it times the plugin's work at each pass boundary sglang calls it at
(`_get_new_batch_prefill_raw`): starting the pass, translating sglang's state and planning (or reusing an idle
scan), and cleaning up after the scan — not the upstream code those hooks wrap, nor the routing of each request an
admitting scan reaches (a few dictionary lookups per admitted request). Beside it, the whole call (upstream's code
the plugin let run included: the adder, the queue scan) and how the pass was planned (`PassKind`): where upstream
returns at once while ``batch_is_full``, the difference between the two is what the plugin made sglang do.
The plugin also runs in every iteration outside that call, decode-only ones included: where a pass's launch
returns (``run_batch``) and where its result lands (``process_batch_result``: the pass is timed and fed to the
online pass-cost fit). That work is timed too (`timed_outside`) and recorded with the next pass boundary
(``outside_ns``). With the plugin off (``FAIRSHARE_PLUGIN_ENABLED=0``) the clock times upstream's whole call alone
(every pass `PassKind.NONE`, no sections): set in an upstream server beside a plugin server, the calls' difference
plus the plugin's work outside the call is all the plugin adds to a scheduler iteration.

Sections are timed with the monotonic wall clock (``perf_counter_ns``, read in user space): the thread CPU-time
clock is a system call, and eight of them per pass cost this VM more than the sections they timed. A section is
microseconds long, so a preemption lands in few of them: the median and p90 the benchmark prints are the sections'
own time even on a loaded machine. With the clock off nothing is read. The durations are kept in memory and
appended to FILE as one JSON line per batch (at most every `FLUSH_PASSES` passes or `FLUSH_S` seconds), so timing
adds no I/O per pass. Read by `benchmarks/sglang_plugin_cost.py` with `read_clock`.
"""

from __future__ import annotations

import json
import os
import time
from array import array
from collections.abc import Callable
from enum import IntEnum
from pathlib import Path
from typing import NamedTuple, TypeVar

T = TypeVar("T")

FLUSH_PASSES = 256
FLUSH_S = 0.5


class PassKind(IntEnum):
    """How the plugin planned one call of `_get_new_batch_prefill_raw`."""

    NONE = 0
    """Not planned: sglang returned before building an adder (empty queue, no free slot, a decode-only pass)."""
    SCAN = 1
    """Planned on a walk of the waiting queue (prefix matches)."""
    REPLAY = 2
    """Planned on the last idle scan's figures, inside the adder sglang built."""
    IDLE = 3
    """Planned on the last idle scan's figures without an adder: sglang's call returned at once."""


class ClockPass(NamedTuple):
    ns: int
    """The plugin's own sections."""
    call_ns: int | None
    """The whole `_get_new_batch_prefill_raw` call, upstream's code included (None: an older plugin's clock)."""
    kind: PassKind | None
    """None: an older plugin's clock, which recorded only the plugin's sections and whether it planned."""
    outside_ns: int | None = None
    """The plugin's work in the scheduler loop since the previous pass boundary, outside the call (None: an older
    plugin's clock, which did not time it)."""


class PluginClock:
    """Sums the plugin's sections within one pass; records the pass at its end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._pass_ns = 0
        self._outside_ns = 0
        self._call_started = 0
        self._passes = array("q")
        self._calls = array("q")
        self._kinds = array("b")
        self._outside = array("q")
        self._last_flush = time.perf_counter()

    def begin_call(self) -> None:
        self._call_started = time.perf_counter_ns()

    def timed(self, section: Callable[..., T], *args: object) -> T:
        """Run `section` and add its time to this pass."""
        started = time.perf_counter_ns()
        try:
            return section(*args)
        finally:
            self._pass_ns += time.perf_counter_ns() - started

    def timed_outside(self, section: Callable[..., T], *args: object) -> T:
        """Run `section`, the plugin's work outside `_get_new_batch_prefill_raw`, and add its time to the next pass
        boundary's record."""
        started = time.perf_counter_ns()
        try:
            return section(*args)
        finally:
            self._outside_ns += time.perf_counter_ns() - started

    def end_pass(self, kind: PassKind) -> None:
        """One call of `_get_new_batch_prefill_raw` (begun at `begin_call`) is over, planned as `kind`."""
        self._calls.append(time.perf_counter_ns() - self._call_started)
        self._passes.append(self._pass_ns)
        self._kinds.append(kind)
        self._outside.append(self._outside_ns)
        self._pass_ns = self._outside_ns = 0
        if len(self._passes) >= FLUSH_PASSES or time.perf_counter() - self._last_flush >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        if self._passes:
            batch = {
                "ns": self._passes.tolist(),
                "call_ns": self._calls.tolist(),
                "kind": self._kinds.tolist(),
                "outside_ns": self._outside.tolist(),
            }
            os.write(self._fd, (json.dumps(batch) + "\n").encode())
            self._passes, self._calls, self._kinds, self._outside = array("q"), array("q"), array("b"), array("q")
        self._last_flush = time.perf_counter()


def read_clock(path: Path, start_line: int = 0) -> tuple[list[ClockPass], int]:
    """Every pass recorded from line `start_line` on, and the next line to read."""
    if not path.exists():
        return [], start_line
    lines = path.read_text().splitlines()
    passes: list[ClockPass] = []
    complete = start_line
    for line in lines[start_line:]:
        try:
            batch = json.loads(line)
        except json.JSONDecodeError:
            break  # a line still being written
        if "kind" in batch:
            outside = batch.get("outside_ns") or [None] * len(batch["ns"])  # None: before the plugin timed it
            rows = zip(batch["ns"], batch["call_ns"], map(PassKind, batch["kind"]), outside, strict=True)
            passes.extend(ClockPass(*row) for row in rows)
        else:  # an older plugin's line (`--before-ref`)
            passes.extend(ClockPass(ns, None, None) for ns in batch["ns"])
        complete += 1
    return passes, complete
