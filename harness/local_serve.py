"""Shared by the Serve benchmarks: a local Ray + Serve on 127.0.0.1 running config.card12gb.yaml with overrides.

The benchmarks run on the source article's card (`config.card12gb.yaml`, `config.yaml` with the card12gb-27b
preset) so their figures compare with the article's and with earlier runs.
"""

from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from harness import net
from harness.net import free_port
from serve_app.config.serve_path import CONTROLLER_OPTIONS

REPO = Path(__file__).resolve().parents[1]
APP = "fairshare"
CONFIG_FILE = "config.card12gb.yaml"
CARD12GB_MODEL = "sim-card12gb-27b"


def deployment(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    return next(d for d in cfg["applications"][0]["deployments"] if d["name"] == name)


def app_config(port: int, *, num_replicas: int, time_scale: float, **engine_knobs: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(yaml.safe_load((REPO / CONFIG_FILE).read_text()))
    cfg["http_options"] = {"host": "127.0.0.1", "port": port}
    engine = deployment(cfg, "Engine")
    engine["num_replicas"] = num_replicas
    engine["user_config"]["time_scale"] = time_scale
    engine["user_config"].update(engine_knobs)
    return cfg


RAY_START_ATTEMPTS = 3
SERVE_START_ATTEMPTS = 3


def start_ray(namespace: str = "serve", num_cpus: int = 4, metrics_port: int | None = None) -> None:
    """A local Ray on this machine, tried again when the node misses Ray's fixed 30 s start-up window (it does on
    2 shared cores under load: "The current node timed out during startup")."""
    import ray

    options: dict[str, Any] = {"_metrics_export_port": metrics_port} if metrics_port is not None else {}
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            ray.init(
                address="local",
                include_dashboard=False,
                num_cpus=num_cpus,
                namespace=namespace,
                log_to_driver=False,
                **options,
            )
            return
        except Exception as e:
            ray.shutdown()
            if "timed out during startup" not in str(e) or attempt == RAY_START_ATTEMPTS:
                raise


def start(
    port: int,
    num_cpus: int = 4,
    controller_options: dict[str, Any] | None = None,
    metrics_port: int | None = None,
    namespace: str = "serve",
) -> None:
    """Ray and Serve on this machine; `controller_options`: a config's top-level block (default: the shipped
    configs' own, `serve_path.CONTROLLER_OPTIONS`)."""
    start_ray(namespace=namespace, num_cpus=num_cpus, metrics_port=metrics_port)
    start_front(port, CONTROLLER_OPTIONS if controller_options is None else controller_options)


def start_front(port: int, controller_options: dict[str, Any]) -> None:
    """Serve on the Ray this process is connected to: its front on the head node only, on loopback `port`, with
    `controller_options` (HAProxy's own ports moved to free ones: `with_free_haproxy_ports`)."""
    from ray.serve._private.api import serve_start

    serve_start(
        http_options={"host": "127.0.0.1", "port": port},
        proxy_location="HeadOnly",
        controller_options=with_free_haproxy_ports(controller_options),
    )


HAPROXY_PORT_VARS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")
"""HAProxy's own ports (Ray's defaults: 8404, 9101, fixed): a second Serve on the machine (an app the user runs,
another test session) would hold them, and HAProxy would not start."""


def with_free_haproxy_ports(controller_options: dict[str, Any]) -> dict[str, Any]:
    """`controller_options` with HAProxy's stats and metrics ports on free ports (its HAProxy inherits the
    controller's environment). A copy: the caller's dict is left as it was."""
    options = copy.deepcopy(controller_options)
    env = options.setdefault("runtime_env", {}).setdefault("env_vars", {})
    env.update({var: str(net.free_port()) for var in HAPROXY_PORT_VARS})  # not the probe of the front's port
    return options


def start_on_a_free_port(
    num_cpus: int = 4,
    controller_options: dict[str, Any] | None = None,
    metrics_port: int | None = None,
    namespace: str = "serve",
) -> int:
    """`start` with Serve's proxy on a free loopback port, which it returns. Tried afresh on another port when the
    start fails: the port probed free can be taken before the proxy binds it (Ray's own processes bind random ports
    as they come up), and Ray's node start can time out on a busy machine."""
    for attempt in range(1, SERVE_START_ATTEMPTS + 1):
        port = free_port()
        try:
            start(port, num_cpus, controller_options, metrics_port, namespace)
            return port
        except Exception:
            with contextlib.suppress(Exception):
                stop()
            if attempt == SERVE_START_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def deploy(cfg: dict[str, Any], timeout_s: float = 180, poll_s: float = 0.25) -> None:
    """Deploy the config's apps as `serve deploy` does; return once every app is RUNNING with every deployment
    HEALTHY (a deploy failure raises with Serve's message)."""
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    _get_global_client().deploy_apps(ServeDeploySchema.model_validate(cfg))
    names = {a["name"] for a in cfg["applications"]}
    deadline = time.monotonic() + timeout_s
    time.sleep(0.5)
    while time.monotonic() < deadline:
        apps = serve.status().applications
        if all(n in apps and _serving(apps[n]) for n in names):
            return
        failed = [apps[n].message for n in names if n in apps and apps[n].status == "DEPLOY_FAILED"]
        if failed:
            raise RuntimeError(f"deploy failed: {failed}")
        time.sleep(poll_s)
    raise TimeoutError(f"the apps did not become RUNNING in {timeout_s} s: {serve.status().applications}")


def front_routes(url: str, timeout_s: float = 30, poll_s: float = 0.25) -> bool:
    """Whether Serve's front at `url` routes to the app (its `/health`, open without a key, answers 200) within
    `timeout_s`. An app RUNNING is not enough: the front takes its routes after, and Serve's HAProxy manager has
    hung mid-reload (its HAProxy never started, seen once in a full test run), leaving a front that answers 404."""
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{url}/health", timeout=5).status_code == 200:
                return True
        time.sleep(poll_s)
    return False


def _serving(app: Any) -> bool:
    return app.status == "RUNNING" and all(d.status == "HEALTHY" for d in app.deployments.values())


def delete(name: str) -> None:
    from ray import serve

    serve.delete(name, _blocking=True)


def stop() -> None:
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")
