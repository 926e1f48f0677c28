"""The plugin's own time per scheduler pass, measured inside the scheduler process (off by default).

With ``FAIRSHARE_PLUGIN_CLOCK=FILE`` it times the plugin's work at each pass boundary sglang calls it at
(`_get_new_batch_prefill_raw`): starting the pass, translating sglang's state and planning (or reusing an idle
scan), and cleaning up after the scan — not the upstream code those hooks wrap, nor the routing of each request an
admitting scan reaches (a few dictionary lookups per admitted request). Sections are timed with the monotonic
wall clock (``perf_counter_ns``, read in user space): the thread CPU-time clock is a system call, and eight of them
per pass cost this VM more than the sections they timed. A section is microseconds long, so a preemption lands in
few of them: the median and p90 the benchmark prints are the sections' own time even on a loaded machine. With the
clock off nothing is read. The durations are kept
in memory and appended to FILE as one JSON line per batch (at most every `FLUSH_PASSES` passes or `FLUSH_S`
seconds), so timing adds no I/O per pass. Read by
`benchmarks/sglang_plugin_cost.py` with `read_clock`.
"""

from __future__ import annotations

import json
import os
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

FLUSH_PASSES = 256
FLUSH_S = 0.5


class PluginClock:
    """Sums the plugin's sections within one pass; records the pass at its end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._pass_ns = 0
        self._passes = array("q")
        self._planned = array("b")
        self._last_flush = time.perf_counter()

    def timed(self, section: Callable[..., T], *args: object) -> T:
        """Run `section` and add its time to this pass."""
        started = time.perf_counter_ns()
        try:
            return section(*args)
        finally:
            self._pass_ns += time.perf_counter_ns() - started

    def end_pass(self, planned: bool) -> None:
        """One call of `_get_new_batch_prefill_raw` is over; `planned`: the plugin planned a pass in it."""
        self._passes.append(self._pass_ns)
        self._planned.append(planned)
        self._pass_ns = 0
        if len(self._passes) >= FLUSH_PASSES or time.perf_counter() - self._last_flush >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        if self._passes:
            line = json.dumps({"ns": self._passes.tolist(), "planned": self._planned.tolist()}) + "\n"
            os.write(self._fd, line.encode())
            self._passes, self._planned = array("q"), array("b")
        self._last_flush = time.perf_counter()


def read_clock(path: Path, start_line: int = 0) -> tuple[list[tuple[int, bool]], int]:
    """(pass ns, planned) for every pass recorded from line `start_line` on, and the next line to read."""
    if not path.exists():
        return [], start_line
    lines = path.read_text().splitlines()
    passes: list[tuple[int, bool]] = []
    complete = start_line
    for line in lines[start_line:]:
        try:
            batch = json.loads(line)
        except json.JSONDecodeError:
            break  # a line still being written
        passes.extend(zip(batch["ns"], map(bool, batch["planned"]), strict=True))
        complete += 1
    return passes, complete
