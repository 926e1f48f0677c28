"""A local Ray + Serve running `config.card12gb.yaml` (as `serve run` deploys it), with test-sized knobs.

The article's 12 GB card (`config.yaml` with the article's preset) makes a pass ~0.26 s, so a clock scaled to
1/20 still leaves every stream many passes: a disconnect lands mid-stream, loads are visible.

The app is deployed through the same path `serve run config.yaml` uses (`ServeDeploySchema` ->
`deploy_apps`), so the file's deployment overrides, user_configs and router class are what run.
Only the HTTP port (a free one on 127.0.0.1), replica count, time scale and a few knobs change.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from harness.local_serve import (
    CARD12GB_MODEL,
    CONFIG_FILE,
    deploy,
    deployment,
    front_routes,
    start_on_a_free_port,
    stop,
)
from harness.net import free_port, listener
from serve_app.config.serve_path import CONTROLLER_OPTIONS

REPO = Path(__file__).resolve().parents[2]
DEPLOY_TIMEOUT_S = 300
"""Generous: on 2 shared cores under load, starting Ray and four replicas has taken 150 s."""
FRONT_ATTEMPTS = 2


def serve_test_config(port: int) -> dict[str, Any]:
    """config.card12gb.yaml with three engine replicas (one long, two chat) and a fast clock."""
    cfg = yaml.safe_load((REPO / CONFIG_FILE).read_text())
    cfg["http_options"] = {"host": "127.0.0.1", "port": port}
    app = cfg["applications"][0]
    app["args"]["sim"]["natural_output_tokens"] = 4096
    engine = deployment(cfg, "Engine")
    engine["num_replicas"] = 3
    engine["max_ongoing_requests"] = 8
    engine["max_queued_requests"] = 4
    engine["ray_actor_options"] = {"num_cpus": 0.1}
    engine["request_router_config"]["request_routing_stats_period_s"] = 0.2
    engine["user_config"]["time_scale"] = 0.05
    ingress = deployment(cfg, "Ingress")
    ingress["ray_actor_options"] = {"num_cpus": 0.1}
    ingress["user_config"]["busy_pending_requests"] = 2
    return cfg


@dataclass
class ServeHandle:
    base_url: str
    model: str
    config: dict[str, Any]
    """The config deployed now."""
    metrics_url: str
    """Ray's Prometheus endpoint on this node (the app's metrics appear there, prefixed `ray_`)."""

    @property
    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, timeout=60)

    baseline: dict[str, Any] = field(default_factory=dict)
    """The module's config: each test starts from it."""

    def deploy(self, cfg: dict[str, Any]) -> None:
        deploy(cfg, timeout_s=DEPLOY_TIMEOUT_S)
        self.config = cfg

    def replica(self, replica_id: str) -> dict[str, Any]:
        r = httpx.get(f"{self.base_url}/admin/replicas/{replica_id}", timeout=30)
        r.raise_for_status()
        return r.json()


@contextlib.contextmanager
def serving(
    edit: Callable[[dict[str, Any]], None] | None = None, controller_env: dict[str, str] | None = None
) -> Iterator[ServeHandle]:
    """Ray and Serve on this machine running `serve_test_config`, changed by `edit` (if given) before it is deployed:
    for a module whose app needs another environment or other knobs from the start; `controller_env`: variables
    added to the controller's environment (as a KubeRay overlay adds them). Shut down after."""
    # The controller as the config file sets it; the proxy on a port found free just before it binds.
    options = copy.deepcopy(CONTROLLER_OPTIONS)
    options["runtime_env"]["env_vars"].update(controller_env or {})
    for attempt in range(1, FRONT_ATTEMPTS + 1):
        metrics_port = free_port()
        port = start_on_a_free_port(controller_options=options, metrics_port=metrics_port)
        cfg = serve_test_config(port)
        try:
            if edit is not None:
                edit(cfg)
            assert cfg["proxy_location"] == "HeadOnly" and cfg["controller_options"] == CONTROLLER_OPTIONS
            deploy(cfg, timeout_s=DEPLOY_TIMEOUT_S)
            routed = front_routes(f"http://127.0.0.1:{port}")
        except BaseException:
            stop()
            raise
        if routed:
            break
        stop()  # a front that never took the app's routes (`front_routes`): Ray and Serve afresh
        if attempt == FRONT_ATTEMPTS:
            raise RuntimeError(f"Serve's front on port {port} never routed to the app")
    try:
        front = listener(port)
        assert front is not None and front.name() == "haproxy"  # the shipped front: Serve's high-throughput mode
        yield ServeHandle(
            f"http://127.0.0.1:{port}",
            CARD12GB_MODEL,
            copy.deepcopy(cfg),
            f"http://127.0.0.1:{metrics_port}/metrics",
            baseline=copy.deepcopy(cfg),
        )
    finally:
        stop()


@pytest.fixture(scope="module")
def served() -> Iterator[ServeHandle]:
    with serving() as handle:
        yield handle
