"""A local Serve whose probed port is taken before the proxy binds it starts on another one."""

from __future__ import annotations

import socket

import httpx
import pytest

from harness import local_serve
from harness.net import free_port

pytestmark = [pytest.mark.serve, pytest.mark.timeout(600)]


def test_a_port_taken_after_the_probe_is_tried_again_on_another(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy, spare = taken.getsockname()[1], free_port()
        probes = iter([busy, spare])
        monkeypatch.setattr(local_serve, "free_port", lambda: next(probes))
        try:
            port = local_serve.start_on_a_free_port(num_cpus=1)
            assert port == spare
            # Serve's proxy answers there: 503 "Route table is not populated yet" while no app is deployed.
            r = httpx.get(f"http://127.0.0.1:{port}/-/healthz", timeout=30)
            assert r.status_code in (200, 503), r.text
        finally:
            local_serve.stop()
