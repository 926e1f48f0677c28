"""A server the harness starts for a test or a benchmark: a command in its own process group, ready when it answers,
and stopped with its whole group (only what it started) however the caller leaves."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def service(
    cmd: list[str],
    log: Path,
    ready: Callable[[], bool],
    timeout_s: float,
    poll_s: float = 0.5,
    stop_timeout_s: float = 30,
    env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """`cmd` writing to `log`, once `ready()` is true (an exception in it counts as not yet); a RuntimeError naming
    the log when it exits first or `timeout_s` passes. SIGTERM to its group on exit, SIGKILL if it lingers."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + timeout_s
        while not _answers(ready):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{Path(cmd[0]).name} did not start; see {log}: {log.read_text()[-2000:]}")
            time.sleep(poll_s)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=stop_timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _answers(ready: Callable[[], bool]) -> bool:
    try:
        return ready()
    except Exception:
        return False
