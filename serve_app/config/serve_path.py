"""Ray Serve's settings the shipped configs set: the front (Serve's high-throughput mode: HAProxy and direct
ingress), the request path (application `runtime_env.env_vars`), the controller's loop (top-level
`controller_options`) and the processes' priority (both).

The front. Serve's Python proxy parses every request, hands it to the ingress replica over a Ray call and relays
the stream back: with the ingress and the engine replica's hop it cost more CPU per request than the engines it
fronts. Serve's high-throughput mode (`FRONT_ENV`: `RAY_SERVE_ENABLE_HA_PROXY` and `RAY_SERVE_THROUGHPUT_OPTIMIZED`)
puts HAProxy on the HTTP port instead, which forwards the bytes to the ingress replica's own HTTP server (direct
ingress): one Python hop fewer, about twice the requests/s on two cores and half the CPU per request (measured:
`python -m benchmarks.serve_overhead`, docs/benchmarks.md). The controller starts HAProxy, so the controller's
environment must have it (`controller_options`); the ingress replica serves HTTP itself, so the application's must
too. Both places or neither: `front_problems` refuses a config that sets one. The other front (Serve's Python
proxy) is the same variables at "0" in both places. What the mode bundles and we keep: the access log buffered
(1000 lines), Serve's logs in files only (`/tmp/ray/session_latest/logs/serve/`, no copy on stderr), GC frozen
after start-up. HAProxy also listens on its stats (8404) and Prometheus (9101) ports on every interface (Ray's
template; `RAY_SERVE_HAPROXY_STATS_PORT`, `RAY_SERVE_HAPROXY_METRICS_PORT` move them).

The request path. Serve's defaults put two thread hops on every request: the user code of a replica runs on its
own thread's loop, and a handle's router on another; each hop is a cross-thread wake-up, which on a busy machine
waits for the OS scheduler. Our replicas never block their loop (the sim engine is async, sglang runs on its own
`EngineThread` thread), so the hops buy nothing here. Handles send requests over Serve's inter-deployment gRPC
instead of Ray actor calls by reference. The high-throughput mode implies these three; they are set explicitly so
that the Python-proxy front keeps them.

The controller's loop. Serve's controller runs its control loop every 0.1 s, and each step asks the GCS for every
node's resources: on an idle app on two cores the controller and the GCS took as much CPU between them as every
replica together. At 0.5 s (`CONTROL_LOOP_ENV`) they take about half that. What the loop drives is slower than that
anyway: health checks every 10 s, autoscaling metrics every 10 s, and the replicas' routing stats every
``request_routing_stats_period_s`` (0.5 s in our configs); a replica starting or stopping is seen up to 0.4 s later.
Measured: `python -m benchmarks.serve_idle_cpu` (docs/benchmarks.md).

The ingress's drain. Under direct ingress, Serve holds a stopping ingress replica open at least
`RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S` (30 s by default) so that an external load balancer (an ALB) can
deregister it first; the controller waits that long too, and raises the ingress's `graceful_shutdown_timeout_s` to
cover it. Here nothing but HAProxy sends to an ingress replica's port (a client, or a Kubernetes Service, reaches
HAProxy), and HAProxy drops a replica as soon as the controller's update reaches it, and retries a
refused connection elsewhere. So `INGRESS_DRAIN_ENV` sets 5 s, in both environments (the controller times the stop,
the replica holds itself open): a Ctrl-C of `serve run`, a `serve shutdown` and an ingress redeploy stop in seconds,
not half a minute. Requests in flight are still drained up to `graceful_shutdown_timeout_s` (except on a Ctrl-C of
`serve run`, where Serve stops HAProxy first, whatever the drain).

The processes' priority. Every Ray worker lowers its own priority to niceness 15 as it starts (Ray's
`worker_niceness`), unless its environment says otherwise: Ray's job supervisor sets it to 0 for itself the same
way. At 15, this app's replicas, every process they start (sglang's scheduler, which drives the device, and its
detokenizer) and HAProxy (which the controller's actor starts) ran below every process at 0 on the host: the
raylet, the GCS, the dashboard, the client, any other program. sglang's own server runs at 0, and so does the
router it is compared with. `WORKER_PRIORITY_ENV` keeps the request path at the priority the raylet runs at (0
unless the operator starts Ray niced), in the application's environment (the replicas) and the controller's (the
controller, HAProxy and its manager). A worker only ever lowers its own priority, so this needs no privilege. Ray's
idle pool workers, which run none of this app, stay at 15. It does not make the CPU engines' schedulers wait for a
core as little as a stock server's beside the same load (`python -m loadtests.peers`, its "CPU cores waited for"
rows): what they wait behind there is mostly this app's own processes, at either priority.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

INGRESS_DRAIN_ENV: dict[str, str] = {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "5"}
"""How long a stopping ingress replica stays open for HAProxy to drop it, in the controller's and the
application's environment alike."""

WORKER_PRIORITY_ENV: dict[str, str] = {"RAY_worker_niceness": "0"}
"""The request path's processes at the raylet's priority, not Ray's niceness 15 (its case is Ray's)."""

SERVE_PATH_ENV: dict[str, str] = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1",
    **INGRESS_DRAIN_ENV,
    **WORKER_PRIORITY_ENV,
}

FRONT_ENV: dict[str, str] = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
"""Serve's high-throughput front, in the controller's and the application's environment alike."""
PYTHON_PROXY_ENV: dict[str, str] = dict.fromkeys(FRONT_ENV, "0")
"""The switch back to Serve's Python proxy: the same variables, off, in both places."""

CONTROL_LOOP_ENV: dict[str, str] = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5"}
"""Serve's control loop every 0.5 s, not its 0.1 s, in the controller's environment."""

CONTROLLER_ENV: dict[str, str] = {
    **CONTROL_LOOP_ENV,
    **INGRESS_DRAIN_ENV,
    **WORKER_PRIORITY_ENV,
    **FRONT_ENV,
}
CONTROLLER_OPTIONS: dict[str, Any] = {"runtime_env": {"env_vars": CONTROLLER_ENV}}
"""A config's top-level `controller_options` (Serve applies it when it starts the controller, and only then)."""


def front_of(env_vars: Mapping[str, str] | None) -> str:
    """Which front an environment asks for: `haproxy` (`FRONT_ENV`), `proxy` (Serve's Python proxy: the
    variables unset or "0"), or `mixed`."""
    env = dict(env_vars or {})
    if all(env.get(k) == v for k, v in FRONT_ENV.items()):
        return "haproxy"
    if all(env.get(k, "0") == "0" for k in FRONT_ENV):
        return "proxy"
    return "mixed"


def env_vars_of(block: Mapping[str, Any] | None) -> dict[str, str]:
    """A config block's `runtime_env.env_vars` (the controller's options, an application)."""
    return dict(((block or {}).get("runtime_env") or {}).get("env_vars") or {})


def front_problems(controller_options: Mapping[str, Any] | None, app_env_vars: Mapping[str, str] | None) -> list[str]:
    """What a config gets wrong about its front (empty: nothing): the controller's environment and the
    application's must ask for the same one, wholly."""
    controller, app = front_of(env_vars_of(controller_options)), front_of(app_env_vars)
    if controller == app != "mixed":
        return []
    wanted = ", ".join(f"{k}={v!r}" for k, v in FRONT_ENV.items())
    return [
        f"front: controller_options asks for {controller!r} and the application's runtime_env for {app!r}; set "
        f"{wanted} in both (Serve's high-throughput front), or both to '0' in both (Serve's Python proxy)"
    ]


def ingress_drain_problems(
    controller_options: Mapping[str, Any] | None, app_env_vars: Mapping[str, str] | None
) -> list[str]:
    """What a config gets wrong about the ingress's drain (empty: nothing): the controller kills a stopping ingress
    replica by its own value while the replica stays open by the application's, so the two must agree."""
    (key,) = INGRESS_DRAIN_ENV
    controller, app = env_vars_of(controller_options).get(key), dict(app_env_vars or {}).get(key)
    if controller == app:
        return []
    return [
        f"{key}: controller_options has {controller!r} and the application's runtime_env {app!r}; set the same "
        f"value in both (unset: Serve's 30 s), or the controller may kill an ingress replica while it drains"
    ]


def serve_path_problems(env_vars: Mapping[str, str] | None) -> list[str]:
    """What an application's `runtime_env.env_vars` gets wrong about the request path (empty: nothing)."""
    env = dict(env_vars or {})
    return [f"{k}: {env.get(k)!r}, expected {v!r}" for k, v in SERVE_PATH_ENV.items() if env.get(k) != v]


def controller_problems(controller_options: Mapping[str, Any] | None) -> list[str]:
    """What a config's top-level `controller_options` gets wrong about the controller's loop, the ingress's drain
    and the processes' priority (empty: nothing)."""
    env = env_vars_of(controller_options)
    return [
        f"controller_options.runtime_env.env_vars.{k}: {env.get(k)!r}, expected {v!r}"
        for k, v in CONTROLLER_ENV.items()
        if k not in FRONT_ENV and env.get(k) != v
    ]
