"""The RayService's `serveConfigV2`, generated from the Serve config files: `python -m serve_app.config.kuberay`.

Each kustomize overlay in `k8s/overlays/` serves one config file (`gpu`: `config.gpu.yaml`, `cpu-demo`:
`config.yaml`). Its `serve-config.yaml` patch is that file with the only changes a cluster needs:

- `http_options.host: 0.0.0.0`: the proxy must accept traffic from the pod network; the Kubernetes Service
  in front of it is the boundary, not the loopback interface.
- where the front is Serve's HAProxy, `controller_options` names the image's HAProxy wrapper (splice off:
  `serve_app.config.haproxy_binary`), which a laptop's config cannot name (it has no fixed path there).
- the `Engine` deployment's fixed `num_replicas` becomes Serve autoscaling from that many replicas up to the
  overlay's maximum; an Engine with its own `autoscaling_config` keeps its bounds and delays as written. Either
  way the overlay's `EngineScaling.policy` decides what it scales on: `slo` (the default) the SLO policy
  (`serve_app.autoscaling`, with the file's `policy_kwargs` where it names the policy already; the default since it
  won the autoscaling benchmark, `benchmarks/autoscale_ramp.py`), `requests` Serve's own policy on ongoing requests
  at `target_ongoing_requests`. With lanes that follow the load
  (`long_lane_replicas: null`) the replicas the autoscaler adds take whatever role the load needs; with static
  lanes a replica's lane follows its rank (ranks below `long_lane_replicas` serve documents), so the long lane
  keeps its size and added replicas join the chat lane.

A generated config must pass `serve_app.config.check` (Serve's schema, our typed sections) before it is written.

It also writes `k8s/monitoring/prometheusrule.yaml`, the Prometheus Operator's form of the alert rules in
`observability/prometheus/fairshare-alerts.yaml` (the one copy of the rules; the `gpu` overlay includes
`k8s/monitoring/`). `--check` writes nothing and exits 1 when a generated file is stale (its source changed since
it was written).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from serve_app.config import haproxy_binary
from serve_app.config.autoscaling import SLO_POLICY_FUNCTION
from serve_app.config.check import problems
from serve_app.config.serve_path import env_vars_of, front_of

REPO = Path(__file__).resolve().parents[2]
ENGINE = "Engine"
CLUSTER_HOST = "0.0.0.0"  # inside a pod: the Service in front decides who reaches it
RAY_SERVICE_NAME = "fairshare"
PATCH_NAME = "serve-config.yaml"
ALERT_RULES = Path("observability") / "prometheus" / "fairshare-alerts.yaml"
PROMETHEUS_RULE = Path("k8s") / "monitoring" / "prometheusrule.yaml"


class EngineScaling(BaseModel):
    """Serve autoscaling of the `Engine` deployment on a cluster."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_replicas: int = Field(ge=1, description="Most engine replicas; the worker group's maxReplicas must fit them.")
    policy: Literal["requests", "slo"] = Field(
        "slo",
        description="What Serve scales the engines on: `requests`, Serve's own policy on ongoing requests per "
        "replica; `slo`, the chats' predicted TTFT and the queued prefill (`serve_app.autoscaling`).",
    )
    target_ongoing_requests: float = Field(
        gt=0, description="Requests per replica Serve scales towards (the `requests` policy only: the switch back)."
    )
    upscale_delay_s: float = Field(30.0, ge=0, description="Load must stay high this long before a replica is added.")
    downscale_delay_s: float = Field(
        600.0, ge=0, description="Load must stay low this long before a replica (a GPU pod, later) goes away."
    )


class Overlay(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(description="Serve config file at the repository root.")
    scaling: EngineScaling


OVERLAYS: dict[str, Overlay] = {
    # Below sglang's max_running_requests in config.gpu.yaml: scale before requests queue in the engine.
    "gpu": Overlay(source="config.gpu.yaml", scaling=EngineScaling(max_replicas=8, target_ongoing_requests=24)),
    # Below the sim engine's concurrency limit (PolicyConfig.max_running_requests, 10).
    "cpu-demo": Overlay(source="config.yaml", scaling=EngineScaling(max_replicas=4, target_ongoing_requests=8)),
}


def serve_config(raw: dict[str, Any], scaling: EngineScaling) -> dict[str, Any]:
    """The cluster's Serve config: `raw` (a config file's content) with the changes named in the module doc."""
    out = copy.deepcopy(raw)
    out.setdefault("http_options", {})["host"] = CLUSTER_HOST
    controller_env = env_vars_of(out.get("controller_options"))
    if front_of(controller_env) == "haproxy":
        runtime_env = out["controller_options"].setdefault("runtime_env", {})
        runtime_env["env_vars"] = {**controller_env, haproxy_binary.ENV: haproxy_binary.IMAGE_PATH}
    engines = [d for app in out["applications"] for d in app.get("deployments", []) if d.get("name") == ENGINE]
    if not engines:
        raise ValueError(f"no `{ENGINE}` deployment to scale: name it in the config file's deployments")
    for deployment in engines:
        if "autoscaling_config" in deployment:
            deployment["autoscaling_config"] = _with_policy(deployment["autoscaling_config"], scaling)
        else:
            deployment["autoscaling_config"] = engine_autoscaling(deployment.pop("num_replicas", 1), scaling)
    return out


def engine_autoscaling(replicas: int, scaling: EngineScaling) -> dict[str, Any]:
    """The Engine's `autoscaling_config` for a config file's fixed replica count (Serve's default: 1): from it up to
    the overlay's maximum, on the overlay's policy."""
    return _with_policy(_bounds(replicas, scaling), scaling)


def _bounds(replicas: int, scaling: EngineScaling) -> dict[str, Any]:
    """Autoscaling for a file's fixed replica count: never below it, up to the overlay's maximum."""
    if scaling.max_replicas < replicas:
        raise ValueError(f"max_replicas={scaling.max_replicas} is below the file's num_replicas={replicas}")
    return {
        "min_replicas": replicas,
        "initial_replicas": replicas,
        "max_replicas": scaling.max_replicas,
        "upscale_delay_s": scaling.upscale_delay_s,
        "downscale_delay_s": scaling.downscale_delay_s,
    }


def _with_policy(autoscaling: dict[str, Any], scaling: EngineScaling) -> dict[str, Any]:
    """`autoscaling` scaling on the overlay's policy; a file that names the SLO policy keeps its kwargs."""
    out = {k: v for k, v in autoscaling.items() if k not in ("policy", "target_ongoing_requests")}
    if scaling.policy == "requests":
        return {**out, "target_ongoing_requests": scaling.target_ongoing_requests}
    policy = autoscaling.get("policy") or {}
    kwargs = policy.get("policy_kwargs", {}) if policy.get("policy_function") == SLO_POLICY_FUNCTION else {}
    return {**out, "policy": {"policy_function": SLO_POLICY_FUNCTION, "policy_kwargs": kwargs}}


class _Literal(str):
    """A string written as a YAML block (`|`), so the embedded config reads as YAML in the manifest."""


def _literal(dumper: yaml.SafeDumper, value: _Literal) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Literal, _literal)


def patch_text(name: str, overlay: Overlay, repo: Path = REPO) -> str:
    """The overlay's kustomize patch that sets `spec.serveConfigV2`."""
    config = serve_config(yaml.safe_load((repo / overlay.source).read_text()), overlay.scaling)
    found = problems(config)
    if found:
        raise ValueError(f"{overlay.source} as served on the cluster ({name}): " + "; ".join(found))
    patch = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": RAY_SERVICE_NAME},
        "spec": {"serveConfigV2": _Literal(yaml.safe_dump(config, sort_keys=False))},
    }
    header = (
        f"# Generated from {overlay.source} by `python -m serve_app.config.kuberay`: edit that file and run it again.\n"
    )
    return header + yaml.dump(patch, Dumper=_Dumper, sort_keys=False, width=120)


def patch_path(name: str, repo: Path = REPO) -> Path:
    return repo / "k8s" / "overlays" / name / PATCH_NAME


def prometheus_rule_text(repo: Path = REPO) -> str:
    """The alert rules file as a `PrometheusRule` (Prometheus Operator): its groups, as they are."""
    rules = yaml.safe_load((repo / ALERT_RULES).read_text())
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": RAY_SERVICE_NAME, "labels": {"app.kubernetes.io/name": "fairshare-serve"}},
        "spec": {"groups": rules["groups"]},
    }
    header = (
        f"# Generated from {ALERT_RULES} by `python -m serve_app.config.kuberay`: edit that file and run it again.\n"
    )
    return header + yaml.safe_dump(resource, sort_keys=False, width=120)


def generated(repo: Path = REPO) -> dict[Path, str]:
    """Every file the generator writes, by path, with its text."""
    files = {patch_path(name, repo): patch_text(name, overlay, repo) for name, overlay in OVERLAYS.items()}
    files[repo / PROMETHEUS_RULE] = prometheus_rule_text(repo)
    return files


def main(argv: list[str] | None = None, repo: Path = REPO) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--check"]):
        print("usage: python -m serve_app.config.kuberay [--check]", file=sys.stderr)
        return 2
    stale = [path for path, text in generated(repo).items() if not path.exists() or path.read_text() != text]
    if not args:
        for path, text in generated(repo).items():
            if path in stale:
                path.write_text(text)
    verb = "stale (run `python -m serve_app.config.kuberay`)" if args else "written"
    for path in stale:
        print(f"{path.relative_to(repo)}: {verb}")
    return 1 if stale and args else 0


if __name__ == "__main__":
    sys.exit(main())
