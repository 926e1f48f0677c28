"""Loopback networking for the harness: free ports and plain JSON requests."""

from __future__ import annotations

import http.client
import json
import socket

import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LISTENER_SCANS = 5
"""Scans for a port's listener: a server that reloads (HAProxy does, when Serve's routes change) hands its socket to
a new process, and the one a scan found may be gone by the time it is read."""


def listener(port: int) -> psutil.Process | None:
    """The process listening on TCP `port`, if any (found by its socket: some servers retitle themselves)."""
    for _ in range(LISTENER_SCANS):
        pids = [
            c.pid
            for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid is not None
        ]
        if not pids:
            return None
        for pid in pids:
            try:
                return psutil.Process(pid)
            except psutil.NoSuchProcess:
                continue  # it handed the socket on and exited: scan again
    return None


def http_json(port: int, method: str, path: str, body: object | None = None, timeout_s: float = 60) -> object:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        payload = None if body is None else json.dumps(body)
        conn.request(method, path, body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {data[:500]!r}")
        return json.loads(data) if data else None
    finally:
        conn.close()
