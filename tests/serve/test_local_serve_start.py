"""A local Serve whose probed port is taken before the proxy binds it starts on another one; a front that does not
route to the app yet is told from one that does."""

from __future__ import annotations

import http.server
import socket
import threading

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


class _Front(http.server.BaseHTTPRequestHandler):
    """A front that answers `/health` with the status its server names (Serve's HAProxy without the app's routes
    answers 404)."""

    def do_GET(self) -> None:
        self.send_response(self.server.status if self.path == "/health" else 500)  # type: ignore[attr-defined]
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(("status", "routes"), [(200, True), (404, False)])
def test_a_front_routes_to_the_app_once_its_health_answers(status: int, routes: bool) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Front)
    server.status = status  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert local_serve.front_routes(url, timeout_s=1.5) is routes
    finally:
        server.shutdown()
        server.server_close()
