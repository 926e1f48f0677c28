"""Ray Serve's request-path settings the shipped configs set (application `runtime_env.env_vars`).

Serve's defaults put two thread hops on every request: the user code of a replica runs on its own
thread's loop, and a handle's router on another; each hop is a cross-thread wake-up, which on a
busy machine waits for the OS scheduler (measured: `python -m benchmarks.serve_overhead`, docs/benchmarks.md).
Our replicas never block their loop (the sim engine is async, sglang runs on its own `EngineLoop`
thread), so the hops buy nothing here. Handles send requests over Serve's inter-deployment gRPC
instead of Ray actor calls by reference.

These are three of the settings `RAY_SERVE_THROUGHPUT_OPTIMIZED=1` bundles; the others are left at
Serve's defaults on purpose: access logs are written as they happen (no log buffer), Serve keeps
logging to stderr, and HTTP still goes through Serve's proxy (no direct ingress).
"""

from __future__ import annotations

from collections.abc import Mapping

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


def serve_path_problems(env_vars: Mapping[str, str] | None) -> list[str]:
    """What an application's `runtime_env.env_vars` gets wrong about the request path (empty: nothing)."""
    env = dict(env_vars or {})
    problems = [f"{k}: {env.get(k)!r}, expected {v!r}" for k, v in SERVE_PATH_ENV.items() if env.get(k) != v]
    problems += [
        f"{k}: {env[k]!r}, keep Serve's default {v!r}" for k, v in KEPT_DEFAULTS.items() if k in env and env[k] != v
    ]
    return problems
