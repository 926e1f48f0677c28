"""Ray Serve's settings the shipped configs set: the request path (application `runtime_env.env_vars`) and the
controller's loop (top-level `controller_options`).

Serve's defaults put two thread hops on every request: the user code of a replica runs on its own
thread's loop, and a handle's router on another; each hop is a cross-thread wake-up, which on a
busy machine waits for the OS scheduler (measured: `python -m benchmarks.serve_overhead`, docs/benchmarks.md).
Our replicas never block their loop (the sim engine is async, sglang runs on its own `EngineThread`
thread), so the hops buy nothing here. Handles send requests over Serve's inter-deployment gRPC
instead of Ray actor calls by reference.

These are three of the settings `RAY_SERVE_THROUGHPUT_OPTIMIZED=1` bundles; the others are left at
Serve's defaults on purpose: access logs are written as they happen (no log buffer), Serve keeps
logging to stderr, and HTTP still goes through Serve's proxy (no direct ingress).

Serve's controller runs its control loop every 0.1 s, and each step asks the GCS for every node's resources: on an
idle app on two cores the controller and the GCS took about 0.14 cores between them, as much as every replica
together. At 0.5 s (`CONTROLLER_ENV`) they take half that. What the loop drives is slower than that anyway: health
checks every 10 s, autoscaling metrics every 10 s, and the replicas' routing stats every
``request_routing_stats_period_s`` (0.5 s in our configs); a replica starting or stopping is seen up to 0.4 s later.
Measured: `python -m benchmarks.serve_idle_cpu` (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SERVE_PATH_ENV: dict[str, str] = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1",
}

KEPT_DEFAULTS: dict[str, str] = {
    "RAY_SERVE_LOG_TO_STDERR": "1",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1",
    "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "0",
}
"""Serve's defaults we rely on (logs to stderr, unbuffered access logs, the proxy in front)."""

CONTROLLER_ENV: dict[str, str] = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5"}
CONTROLLER_OPTIONS: dict[str, Any] = {"runtime_env": {"env_vars": CONTROLLER_ENV}}
"""A config's top-level `controller_options` (Serve applies it when it starts the controller, and only then)."""


def serve_path_problems(env_vars: Mapping[str, str] | None) -> list[str]:
    """What an application's `runtime_env.env_vars` gets wrong about the request path (empty: nothing)."""
    env = dict(env_vars or {})
    problems = [f"{k}: {env.get(k)!r}, expected {v!r}" for k, v in SERVE_PATH_ENV.items() if env.get(k) != v]
    problems += [
        f"{k}: {env[k]!r}, keep Serve's default {v!r}" for k, v in KEPT_DEFAULTS.items() if k in env and env[k] != v
    ]
    return problems


def controller_problems(controller_options: Mapping[str, Any] | None) -> list[str]:
    """What a config's top-level `controller_options` gets wrong about the controller's loop (empty: nothing)."""
    env = dict(((controller_options or {}).get("runtime_env") or {}).get("env_vars") or {})
    return [
        f"controller_options.runtime_env.env_vars.{k}: {env.get(k)!r}, expected {v!r}"
        for k, v in CONTROLLER_ENV.items()
        if env.get(k) != v
    ]
