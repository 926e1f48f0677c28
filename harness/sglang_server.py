"""A local ``python -m sglang.launch_server`` in its own process group, for tests and benchmarks.

`LocalServer` starts the server on a free loopback port (again on another when the probed one was taken before the
server bound it), waits for ``/health`` with a deadline, and stops the whole group (SIGTERM, then SIGKILL) and
nothing else.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.net import free_port, http_json

PORT_TAKEN = "address already in use"
"""In the server's log when its HTTP port was taken between the probe and the bind (the server binds it only once the
engine is up, seconds later, and other processes bind random ports meanwhile). The server does not exit then: its
engine processes live on, so the log is what tells."""


START_ATTEMPTS = 3
"""Starts on a fresh free port, when the port the server was given by probe was taken before it bound it."""


class PortTaken(RuntimeError):
    """The server could not bind its HTTP port."""


PLUGIN_START_LINE = "long_prefill_token_threshold="
"""In the fairshare plugin's start-up line, logged once by every scheduler process it attaches to."""


def launch_server_command(model_path: str | Path, port: int, args: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]


class LocalServer:
    """``python -m sglang.launch_server`` in its own process group; a context manager."""

    def __init__(
        self,
        model_path: str | Path,
        args: list[str],
        env: dict[str, str],
        log_path: Path,
        port: int | None = None,
        startup_timeout_s: float = 600,
        cwd: Path | None = None,
    ) -> None:
        """`cwd`: the server's working directory, first on its import path (``python -m`` puts it there)."""
        self.port_probed = port is None  # a port the caller named is never changed
        self.port = port or free_port()
        self.model_path = model_path
        self.args = args
        self.env = env
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def command(self) -> list[str]:
        return launch_server_command(self.model_path, self.port, self.args)

    def start(self) -> None:
        """Start the server and wait until it is ready; on a fresh port when the probed one was taken meanwhile."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start_once()
                return
            except PortTaken:
                if not self.port_probed or attempt == START_ATTEMPTS:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start_once(self) -> None:
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.cwd
            )
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"sglang exited with code {self.proc.returncode} while starting; log tail:\n{self.log_tail()}"
                )
            if PORT_TAKEN in self.log_text().lower():
                raise PortTaken(f"port {self.port} was taken before sglang bound it; log tail:\n{self.log_tail()}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(1)
        raise TimeoutError(f"sglang not ready after {self.startup_timeout_s:.0f} s; log tail:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 60) -> None:
        """Stop the server's process group (the server and the children it spawned) and nothing else."""
        if self.proc is None or self.proc.poll() is not None:
            self._kill_group(signal.SIGKILL)  # children left behind by a server that died
            return
        self._kill_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._kill_group(signal.SIGKILL)
            self.proc.wait(timeout=30)
        self._kill_group(signal.SIGKILL)

    def _kill_group(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_text()[-chars:]

    def request(self, method: str, path: str, body: object | None = None, timeout_s: float = 120) -> object:
        return http_json(self.port, method, path, body, timeout_s)
