"""A Serve config run as a user runs it: `serve run FILE` in a process group of its own, with its own Ray.

Each `ServeRun` starts its own local Ray (its own temp dir), so two can run side by side on one machine (one front
each). Stopping it is what a user's Ctrl-C does (SIGINT: Serve shuts down, then Ray); what is left after the grace
period, the whole process tree it started (Ray's workers and HAProxy included), is killed: nothing of it outlives
the run, and nothing else on the machine is touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
SERVE = Path(sys.executable).with_name("serve")


class ServeRun:
    """`serve run` of the deploy config `cfg` (written to a file of its own); a context manager."""

    def __init__(self, name: str, cfg: dict[str, Any], log_dir: Path, ready_paths: tuple[str, ...] = ("/health",)):
        self.name = name
        self.cfg = cfg
        self.port = int(cfg["http_options"]["port"])
        self.log_path = log_dir / f"{name}.serve-run.log"
        self.ready_paths = ready_paths
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix=f"serve-run-{name}-")
        self._tree: dict[int, tuple[psutil.Process, str]] = {}
        """Every process seen, with its role as first seen (titles change with the task a worker runs)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServeRun:
        config = Path(self._tmp.name) / "config.yaml"
        config.write_text(yaml.safe_dump(self.cfg, sort_keys=False))
        # Its own Ray temp dir (a session of its own); the repository importable in every replica it starts.
        env = {**os.environ, "RAY_TMPDIR": self._tmp.name, "PYTHONPATH": str(REPO)}
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [str(SERVE), "run", str(config)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        for path in self.ready_paths:
            while True:
                with contextlib.suppress(requests.RequestException):
                    if requests.get(self.url + path, timeout=5).status_code == 200:
                        break
                if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name}: `serve run` did not answer {path}; see {self.log_path}")
                time.sleep(1)

    def processes(self) -> list[psutil.Process]:
        """Every process this run started and still has (Ray's, its workers', HAProxy)."""
        if self.proc is None:
            return []
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                if p.pid not in self._tree:
                    self._tree[p.pid] = (p, role(p))
        return [p for p, _ in self._tree.values() if p.is_running()]

    def cpu_by_role(self) -> dict[str, float]:
        """User + system CPU seconds so far of each role's processes (`role`); a process gone counts 0."""
        self.processes()
        out: dict[str, float] = {}
        for p, name in self._tree.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                t = p.cpu_times()
                out[name] = out.get(name, 0.0) + t.user + t.system
        return out

    def stop(self, grace_s: float = 60) -> None:
        if self.proc is None:
            return
        started = self.processes()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        _, alive = psutil.wait_procs(started, timeout=10)
        for p in alive:  # Ray's workers and HAProxy run in sessions of their own
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        self.proc = None
        self._tmp.cleanup()


def role(process: psutil.Process) -> str:
    """What a process of a Serve run is, from its title: `proxy` (Serve's Python proxy, or HAProxy and the actor that
    manages it), `controller`, `<app>/<deployment>` for a replica, else `ray` (GCS, raylet, dashboard, agents, the
    `serve run` driver)."""
    try:
        title = " ".join(process.cmdline()) or process.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "ray"
    if title.startswith("ray::ServeReplica:"):
        app, _, deployment = title.removeprefix("ray::ServeReplica:").split()[0].partition(":")
        return f"{app}/{deployment.split('.')[0]}"
    if "haproxy" in title.lower() or title.startswith(("ray::ProxyActor", "ray::HAProxyManager")):
        return "proxy"
    if title.startswith("ray::ServeController"):
        return "controller"
    return "ray"
