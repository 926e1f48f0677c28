"""What a rendered RayService must satisfy beyond its schema, one check per rule.

Each check takes the rendered resources of one overlay and returns a list of problems (empty = fine), so
the tests assert both that the shipped manifests pass and that a broken copy is caught.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError
from ray.serve._private.constants import DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S, DEFAULT_GRACEFUL_SHUTDOWN_WAIT_LOOP_S

from scheduler.config import PolicyConfig, env_var_name
from scheduler.sglang_plugin.env import PLUGIN_ENABLED_VAR, PLUGIN_FORCE_VAR

GPU = "nvidia.com/gpu"
MODEL_LOAD_S = 60
"""A model load the probes must sit through without failing a pod (the issue's figure), with 2x margin."""
SERVE_PORT_NAME = "serve"
POLICY_VARS = {env_var_name(f): f for f in PolicyConfig.model_fields}
PLUGIN_VARS = {PLUGIN_ENABLED_VAR, PLUGIN_FORCE_VAR}
APP_ENDPOINTS = re.compile(r":8000|/-/|/v1/")


@dataclass
class RayPod:
    """A pod template of the Ray cluster: its group, Ray's start parameters and the template."""

    group: str
    replicas: tuple[int, int]  # (minReplicas, maxReplicas); the head is (1, 1)
    ray_start_params: dict[str, str]
    template: dict[str, Any]

    @property
    def ray_container(self) -> dict[str, Any]:
        return self.template["spec"]["containers"][0]  # KubeRay's RayContainerIndex

    def ray_resource(self, name: str) -> float:
        """What `ray start` advertises: rayStartParams win over the container's limits (as in KubeRay)."""
        param = {"CPU": "num-cpus", "GPU": "num-gpus"}[name]
        if param in self.ray_start_params:
            return float(self.ray_start_params[param])
        limits = self.ray_container.get("resources", {}).get("limits", {})
        return quantity(limits.get({"CPU": "cpu", "GPU": GPU}[name], 0))


SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "m": 1e-3}


def quantity(value: str | int | float) -> float:
    """A Kubernetes quantity: 8, "8", "500m", "64Gi"."""
    text = str(value)
    for suffix, factor in SUFFIXES.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def ray_service(resources: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [r for r in resources if r["kind"] == "RayService"]
    return found


def ray_pods(rs: dict[str, Any]) -> list[RayPod]:
    cluster = rs["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    pods = [RayPod("head", (1, 1), head.get("rayStartParams", {}), head["template"])]
    for group in cluster.get("workerGroupSpecs", []):
        pods.append(
            RayPod(
                group["groupName"],
                (group["minReplicas"], group["maxReplicas"]),
                group.get("rayStartParams", {}),
                group["template"],
            )
        )
    return pods


def serve_config(rs: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(rs["spec"]["serveConfigV2"])


def deployments(config: dict[str, Any]) -> list[dict[str, Any]]:
    return [d for app in config["applications"] for d in app.get("deployments", [])]


def replica_bounds(deployment: dict[str, Any]) -> tuple[int, int]:
    scaling = deployment.get("autoscaling_config")
    if scaling:
        return scaling["min_replicas"], scaling["max_replicas"]
    return deployment.get("num_replicas", 1), deployment.get("num_replicas", 1)


def actor_resource(deployment: dict[str, Any], name: str) -> float:
    options = deployment.get("ray_actor_options", {})
    return float(options.get({"CPU": "num_cpus", "GPU": "num_gpus"}[name], 1 if name == "CPU" else 0))


# -- rules -----------------------------------------------------------------------------------------


def env_problems(resources: list[dict[str, Any]]) -> list[str]:
    """Every Ray container carries the plugin's switches; every FAIRSHARE_* variable is one the code reads,
    with a value it parses (policy variables through `PolicyConfig` itself, as the plugin reads them)."""
    out = []
    for pod in ray_pods(ray_service(resources)):
        env = {e["name"]: e for e in pod.ray_container.get("env", [])}
        out += [f"{pod.group}: {name} missing" for name in sorted(PLUGIN_VARS - set(env))]
        policy = {}
        for name, entry in env.items():
            if not name.startswith("FAIRSHARE_"):
                continue
            if "value" not in entry:
                out.append(f"{pod.group}: {name} must be a literal value")
            elif name in PLUGIN_VARS:
                try:
                    TypeAdapter(bool).validate_strings(entry["value"])
                except ValidationError:
                    out.append(f"{pod.group}: {name}={entry['value']!r} is not a boolean")
            elif name in POLICY_VARS:
                policy[POLICY_VARS[name]] = entry["value"]
            else:
                out.append(f"{pod.group}: {name} is not a PolicyConfig field nor a plugin switch")
        try:
            PolicyConfig.model_validate(policy)
        except ValidationError as e:
            out.append(f"{pod.group}: {e}")
    return out


def capacity_problems(resources: list[dict[str, Any]]) -> list[str]:
    """The worker groups hold every replica Serve may ask for (CPU and GPU), at the minimum and at the maximum,
    and each replica fits on one pod of some group."""
    rs = ray_service(resources)
    pods, deps = ray_pods(rs), deployments(serve_config(rs))
    out = []
    for name in ("CPU", "GPU"):
        for bound, label in ((0, "min"), (1, "max")):
            demand = sum(replica_bounds(d)[bound] * actor_resource(d, name) for d in deps)
            supply = sum(p.replicas[bound] * p.ray_resource(name) for p in pods)
            if demand > supply:
                out.append(f"{name} at {label} replicas: Serve needs {demand}, the cluster offers {supply}")
    for d in deps:
        if not any(all(actor_resource(d, n) <= p.ray_resource(n) for n in ("CPU", "GPU")) for p in pods):
            out.append(f"{d['name']}: one replica fits on no pod")
    return out


def gpu_problems(resources: list[dict[str, Any]]) -> list[str]:
    """The head holds no GPU; every GPU group gives each pod exactly the GPUs of one GPU replica."""
    rs = ray_service(resources)
    pods = ray_pods(rs)
    gpu_replica = {actor_resource(d, "GPU") for d in deployments(serve_config(rs)) if actor_resource(d, "GPU")}
    out = []
    if pods[0].ray_resource("GPU") != 0:
        out.append("the head advertises GPUs: engine replicas could land on it")
    for pod in pods[1:]:
        res = pod.ray_container.get("resources", {})
        gpus = res.get("limits", {}).get(GPU)
        if gpus is None:
            continue
        if res.get("requests", {}).get(GPU) != gpus:
            out.append(f"{pod.group}: GPU requests differ from limits")
        if {float(gpus)} != gpu_replica:
            out.append(f"{pod.group}: {gpus} GPU per pod, replicas use {sorted(gpu_replica)}")
    if gpu_replica and not any(p.ray_resource("GPU") for p in pods):
        out.append("replicas need GPUs and no group has any")
    return out


def shutdown_problems(resources: list[dict[str, Any]]) -> list[str]:
    """Pods and the old cluster of an upgrade outlive the longest graceful shutdown of a replica."""
    rs = ray_service(resources)
    needed = max(
        d.get("graceful_shutdown_timeout_s", DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S)
        + d.get("graceful_shutdown_wait_loop_s", DEFAULT_GRACEFUL_SHUTDOWN_WAIT_LOOP_S)
        for d in deployments(serve_config(rs))
    )
    out = []
    for pod in ray_pods(rs):
        grace = pod.template["spec"].get("terminationGracePeriodSeconds", 30)
        if grace < needed:
            out.append(f"{pod.group}: terminationGracePeriodSeconds={grace} < {needed} s of replica shutdown")
    delay = rs["spec"].get("rayClusterDeletionDelaySeconds", 60)
    if delay < needed:
        out.append(f"rayClusterDeletionDelaySeconds={delay} < {needed} s of replica shutdown")
    return out


def probe_problems(resources: list[dict[str, Any]]) -> list[str]:
    """Every Ray container has startup, readiness and liveness probes that check Ray's processes only (never a
    Serve app, which is busy loading its model), and tolerate a model load before a restart."""
    out = []
    for pod in ray_pods(ray_service(resources)):
        container = pod.ray_container
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.get(kind)
            if probe is None:
                out.append(f"{pod.group}: no {kind}")
                continue
            command = " ".join(probe.get("exec", {}).get("command", []))
            if not command or APP_ENDPOINTS.search(command):
                out.append(f"{pod.group}: {kind} must run a command on Ray's health endpoints: {command!r}")
            window = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
            if kind != "readinessProbe" and window < 2 * MODEL_LOAD_S:
                out.append(f"{pod.group}: {kind} gives up after {window} s (< {2 * MODEL_LOAD_S} s)")
    return out


def resource_problems(resources: list[dict[str, Any]]) -> list[str]:
    """Every container of every pod sets CPU and memory requests and limits, requests within limits."""
    out = []
    for resource in resources:
        spec = resource.get("spec", {})
        templates = [p.template for p in ray_pods(resource)] if resource["kind"] == "RayService" else []
        if "template" in spec:
            templates.append(spec["template"])
        for template in templates:
            for container in template["spec"]["containers"]:
                where = f"{resource['kind']}/{resource['metadata']['name']}/{container['name']}"
                res = container.get("resources", {})
                for key in ("cpu", "memory"):
                    request, limit = res.get("requests", {}).get(key), res.get("limits", {}).get(key)
                    if request is None or limit is None:
                        out.append(f"{where}: {key} request and limit required")
                    elif quantity(request) > quantity(limit):
                        out.append(f"{where}: {key} request above its limit")
    return out


def service_problems(resources: list[dict[str, Any]]) -> list[str]:
    """The OpenAI Service, the head's `serve` port and the proxy's port agree; the proxy listens beyond loopback."""
    rs = ray_service(resources)
    http = serve_config(rs).get("http_options", {})
    ports = {p["name"]: p["containerPort"] for p in ray_pods(rs)[0].ray_container.get("ports", [])}
    service_ports = [p["port"] for p in rs["spec"].get("serveService", {}).get("spec", {}).get("ports", [])]
    out = []
    if http.get("port", 8000) != ports.get(SERVE_PORT_NAME):
        out.append(f"proxy port {http.get('port', 8000)} is not the head's `serve` port {ports.get(SERVE_PORT_NAME)}")
    if service_ports != [ports.get(SERVE_PORT_NAME)]:
        out.append(f"serveService ports {service_ports} are not the head's `serve` port")
    if http.get("host") != "0.0.0.0":
        out.append(f"proxy host {http.get('host')!r}: the Service cannot reach it")
    return out


def storage_problems(resources: list[dict[str, Any]]) -> list[str]:
    """sglang's model paths (chat and embeddings) are on a volume mounted in every Ray container (replicas load
    them, the Ingress reads the tokenizer), a claim the overlay defines; a Job fills that claim at each path
    with a token from a Secret."""
    rs = ray_service(resources)
    claims = {r["metadata"]["name"] for r in resources if r["kind"] == "PersistentVolumeClaim"}
    paths = {
        app["args"]["sglang"]["model_path"]
        for app in serve_config(rs)["applications"]
        if app.get("args", {}).get("backend") == "sglang"
    } | {
        app["args"]["embeddings"]["model_path"]
        for app in serve_config(rs)["applications"]
        if (app.get("args", {}).get("embeddings") or {}).get("backend") == "sglang"
    }
    out = []
    for path in paths:
        for pod in ray_pods(rs):
            volumes = {v["name"]: v for v in pod.template["spec"].get("volumes", [])}
            mounts = [m for m in pod.ray_container.get("volumeMounts", []) if _under(path, m["mountPath"])]
            claim = [volumes.get(m["name"], {}).get("persistentVolumeClaim", {}).get("claimName") for m in mounts]
            if not set(claim) & claims:
                out.append(f"{pod.group}: {path} is on no mounted claim of this overlay")
        jobs = [
            r
            for r in resources
            if r["kind"] == "Job" and path in r["spec"]["template"]["spec"]["containers"][0].get("command", [])
        ]
        if not jobs:
            out.append(f"no Job downloads the model to {path}")
        for job in jobs:
            env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0].get("env", [])}
            if "secretKeyRef" not in env.get("HF_TOKEN", {}).get("valueFrom", {}):
                out.append(f"{job['metadata']['name']}: HF_TOKEN must come from a Secret")
    return out


def _under(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def monitoring_problems(resources: list[dict[str, Any]]) -> list[str]:
    """Where a PodMonitor comes with the overlay: it selects every Ray pod, and each pod's Ray container has the
    port it scrapes, the port Ray exports its metrics on (`metrics-export-port`)."""
    monitors = [r for r in resources if r["kind"] == "PodMonitor"]
    out = []
    for monitor in monitors:
        selector = monitor["spec"]["selector"]["matchLabels"]
        for pod in ray_pods(ray_service(resources)):
            labels = pod.template.get("metadata", {}).get("labels", {})
            if any(labels.get(k) != v for k, v in selector.items()):
                out.append(f"{pod.group}: not selected by PodMonitor {monitor['metadata']['name']}")
            ports = {p["name"]: p["containerPort"] for p in pod.ray_container.get("ports", [])}
            for endpoint in monitor["spec"]["podMetricsEndpoints"]:
                port = ports.get(endpoint["port"])
                if port is None:
                    out.append(f"{pod.group}: no container port {endpoint['port']!r} to scrape")
                elif str(port) != pod.ray_start_params.get("metrics-export-port"):
                    out.append(f"{pod.group}: port {endpoint['port']!r} is not Ray's metrics-export-port")
    return out
