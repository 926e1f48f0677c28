"""A multi-node Ray cluster on this machine, for tests that lose a node: a head and worker nodes
(`ray.cluster_utils.Cluster`), each node its own raylet, as separate machines would have.

Workers carry `GPU_SLOT`, a custom resource standing in for their GPUs: a deployment that asks for one runs on a
worker, never on the head. The head carries `HEAD_SLOT`, for what must outlive any worker (the ingress, Serve's
front). `remove_worker` kills a worker's raylet and every process on it at once, as a lost machine would;
`add_worker` brings capacity back.

The cluster has a temp dir of its own (`RAY_TMPDIR` set while it runs: its session, sockets and the address file
Ray writes for `ray.init("auto")` live there, not in the machine's `/tmp/ray`), and closing it stops only what it
started: Serve, if `start_serve` started it, then its own nodes' processes. Never `ray stop`, which would stop
every Ray on the machine.
"""

from __future__ import annotations

import contextlib
import copy
import os
from typing import Any

import psutil

from harness.local_serve import SERVE_START_ATTEMPTS, start_front
from harness.net import free_port
from harness.ray_tmpdir import own_ray_tmpdir
from serve_app.config.serve_path import CONTROLLER_OPTIONS

GPU_SLOT = "gpu_slot"
HEAD_SLOT = "head_slot"
HEAD_SLOTS = 100
"""Enough for every deployment a test pins to the head."""


class LocalCluster:
    """A head and `num_workers` workers with `slots_per_worker` GPU slots each; a context manager, connected (the
    driver is this process) while open."""

    def __init__(
        self,
        num_workers: int = 2,
        slots_per_worker: int = 2,
        *,
        head_cpus: int = 2,
        worker_cpus: int = 1,
        namespace: str = "serve",
    ) -> None:
        self.num_workers = num_workers
        self.slots_per_worker = slots_per_worker
        self.head_cpus = head_cpus
        self.worker_cpus = worker_cpus
        self.namespace = namespace
        self.metrics_port = free_port()
        """Ray's Prometheus endpoint on the head (where the ingress runs: its metrics are there)."""
        self._cluster: Any = None
        self._tmp: str | None = None
        self._exit = contextlib.ExitStack()
        """Holds the temp dir (`own_ray_tmpdir`) while the cluster is open."""
        self._serve_started = False

    @property
    def _ray_dir(self) -> str:
        """Ray's root under the temp dir, where `RAY_TMPDIR` leads Ray's own defaults (`<RAY_TMPDIR>/ray`)."""
        assert self._tmp is not None
        return os.path.join(self._tmp, "ray")

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def workers(self) -> list[Any]:
        """The live worker nodes (`ray._private.node.Node`: `.node_id` is Ray's hex node id)."""
        return list(self._cluster.worker_nodes) if self._cluster is not None else []

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> LocalCluster:
        self._tmp = str(self._exit.enter_context(own_ray_tmpdir("rc-")))  # nodes and the driver inherit it
        os.makedirs(self._ray_dir)
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        import ray
        from ray.cluster_utils import Cluster

        head = {
            "num_cpus": self.head_cpus,
            "resources": {HEAD_SLOT: HEAD_SLOTS},
            "include_dashboard": False,
            "metrics_export_port": self.metrics_port,
            "dashboard_agent_listen_port": free_port(),  # Ray's fixed default may be another Ray's on this machine
            "temp_dir": self._ray_dir,
        }
        self._cluster = Cluster()  # first, so that `close` stops a head that failed halfway
        self._cluster.add_node(**head)  # the first node added is the head
        for _ in range(self.num_workers):
            self.add_worker()
        ray.init(address=self._cluster.address, namespace=self.namespace, log_to_driver=False)

    def close(self) -> None:
        """Serve (if this started it), the driver's connection, then every node this cluster started; its temp dir."""
        import ray

        try:
            if self._serve_started:
                from ray import serve

                with contextlib.suppress(Exception):
                    serve.shutdown()
            ray.shutdown()
            if self._cluster is not None:
                self._cluster.shutdown()
        finally:
            self._cluster = None
            self._tmp = None
            self._exit.close()

    # -- nodes -------------------------------------------------------------------------------------
    def add_worker(self) -> Any:
        """A new worker node with its GPU slots; returns once Ray lists it."""
        return self._cluster.add_node(
            num_cpus=self.worker_cpus, resources={GPU_SLOT: self.slots_per_worker}, temp_dir=self._ray_dir
        )

    def remove_worker(self, node: Any) -> None:
        """Lose `node` as a machine is lost: every process on it killed at once, its replicas' workers included.
        (`Cluster.remove_node` kills only the node's own processes; the workers it started notice their raylet gone
        and exit a moment later, taking requests meanwhile, which no lost machine does.)"""
        from ray._private import ray_constants

        raylet = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process
        started = psutil.Process(raylet.pid).children(recursive=True)  # workers and agents
        for p in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        self._cluster.remove_node(node, allow_graceful=False)
        psutil.wait_procs(started, timeout=30)

    def worker_of(self, node_id: str) -> Any:
        return next(n for n in self.workers if n.node_id == node_id)

    # -- Serve -------------------------------------------------------------------------------------
    def start_serve(self) -> int:
        """Serve on the cluster, its front on the head only, on a free loopback port (returned), with the shipped
        configs' controller options (HAProxy's own ports moved to free ones). Tried afresh, on another port, when the
        start fails: on a loaded machine the controller gives up on a front slow to start (it kills it, and the
        start raises), and the port probed free can be taken before the front binds it."""
        from ray import serve

        self._serve_started = True  # from here on, `close` shuts Serve down
        for attempt in range(1, SERVE_START_ATTEMPTS + 1):
            port = free_port()
            try:
                start_front(port, _patient_front(CONTROLLER_OPTIONS))
                return port
            except Exception:
                with contextlib.suppress(Exception):
                    serve.shutdown()
                if attempt == SERVE_START_ATTEMPTS:
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")


FRONT_READY_TIMEOUT_S = 60
"""How long Serve's controller waits for its front to start. Serve's 5 s is less than a new worker process takes to
start on two cores that other work keeps busy: the controller then kills the front before it ran, and the start
fails."""


def _patient_front(controller_options: dict[str, Any]) -> dict[str, Any]:
    """A copy of `controller_options` with `FRONT_READY_TIMEOUT_S`."""
    options = copy.deepcopy(controller_options)
    env = options.setdefault("runtime_env", {}).setdefault("env_vars", {})
    env["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"] = str(FRONT_READY_TIMEOUT_S)
    return options


def replicas(app: str, deployment: str) -> list[dict[str, Any]]:
    """A deployment's replicas as Serve's controller lists them: `replica_id`, `state` (`RUNNING`, `STARTING`,
    `PENDING_ALLOCATION`, ...), `node_id`, `actor_name`, ..."""
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()
    found = details["applications"].get(app, {}).get("deployments", {}).get(deployment, {})
    return list(found.get("replicas", []))
