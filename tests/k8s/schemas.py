"""Closed JSON schemas for every kind in `k8s/`, so a misspelled field or a wrong type fails validation.

The RayService schema is KubeRay v1.7.0's CRD: `k8s/crd/` holds the schema extracted from it, and the CRD
itself is vendored in `tests/k8s/crd/` so a test can check the extraction. A CRD accepts unknown fields unless it says
otherwise (the API server prunes them silently), so every object schema that lists its properties is
closed here with `additionalProperties: false`. The other kinds reuse the Kubernetes schemas the CRD
embeds: a Job's pod template is the head group's pod template, a PVC's spec is the one inside an
ephemeral volume's claim template, object metadata is the serve Service's. The Prometheus Operator's kinds
(`monitoring.coreos.com/v1` PodMonitor and PrometheusRule) are written out here with just the fields `k8s/` uses,
typed as the operator's CRDs type them. CEL rules (`x-kubernetes-validations`) are not evaluated.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

REPO = Path(__file__).resolve().parents[2]
VENDORED = REPO / "k8s" / "crd" / "ray.io_rayservices.v1.7.0.schema.json"
CRD = Path(__file__).resolve().parent / "crd" / "ray.io_rayservices.v1.7.0.yaml"


def schema_from_crd(crd: dict[str, Any]) -> dict[str, Any]:
    """The `v1` openAPIV3Schema of a CRD without `status` (never written by hand) and descriptions."""
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _without_descriptions(version["schema"]["openAPIV3Schema"])
    schema["properties"].pop("status", None)
    return schema


def _without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_without_descriptions(v) for v in node]
    return node


def closed(node: Any) -> Any:
    """`node` with `additionalProperties: false` on every object schema that lists properties."""
    if isinstance(node, list):
        return [closed(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: closed(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _resource(api_version: str, kind: str, metadata: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": {**metadata, "required": ["name"]},
            "spec": spec,
        },
        "additionalProperties": False,
    }


@cache
def schemas() -> dict[str, dict[str, Any]]:
    """Closed schema by kind."""
    crd = closed(json.loads(VENDORED.read_text()))
    spec = crd["properties"]["spec"]
    metadata = spec["properties"]["serveService"]["properties"]["metadata"]
    pod_template = spec["properties"]["rayClusterConfig"]["properties"]["headGroupSpec"]["properties"]["template"]
    volume = pod_template["properties"]["spec"]["properties"]["volumes"]["items"]["properties"]
    claim_spec = volume["ephemeral"]["properties"]["volumeClaimTemplate"]["properties"]["spec"]
    job_spec = {
        # The few JobSpec fields k8s/ may use; add one here (typed) before using it.
        "type": "object",
        "required": ["template"],
        "properties": {
            "backoffLimit": {"type": "integer", "minimum": 0},
            "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
            "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
            "template": pod_template,
        },
        "additionalProperties": False,
    }
    return {
        **monitoring_schemas(metadata),
        "RayService": _resource("ray.io/v1", "RayService", metadata, spec),
        "PersistentVolumeClaim": _resource("v1", "PersistentVolumeClaim", metadata, claim_spec),
        "Job": _resource("batch/v1", "Job", metadata, job_spec),
    }


def _closed_object(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties, "additionalProperties": False}


def monitoring_schemas(metadata: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """PodMonitor and PrometheusRule: the fields `k8s/monitoring/` uses; add one here (typed) before using it."""
    text: dict[str, Any] = {"type": "string"}
    labels = {"type": "object", "additionalProperties": text}
    endpoint = _closed_object(["port"], {"port": text, "path": text, "interval": text})
    pod_monitor = _closed_object(
        ["selector", "podMetricsEndpoints"],
        {
            "selector": _closed_object(["matchLabels"], {"matchLabels": labels}),
            "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": endpoint},
        },
    )
    rule = _closed_object(
        ["alert", "expr"],
        {"alert": text, "expr": text, "for": text, "labels": labels, "annotations": labels},
    )
    group = _closed_object(["name", "rules"], {"name": text, "rules": {"type": "array", "minItems": 1, "items": rule}})
    prometheus_rule = _closed_object(["groups"], {"groups": {"type": "array", "minItems": 1, "items": group}})
    return {
        "PodMonitor": _resource("monitoring.coreos.com/v1", "PodMonitor", metadata, pod_monitor),
        "PrometheusRule": _resource("monitoring.coreos.com/v1", "PrometheusRule", metadata, prometheus_rule),
    }


@cache
def _validator(kind: str) -> jsonschema.Draft7Validator:
    schema = schemas()[kind]
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def validate(resource: dict[str, Any]) -> None:
    """Raise `jsonschema.ValidationError` naming the most relevant bad field (or an unknown kind)."""
    kind = resource.get("kind")
    if kind not in schemas():
        raise jsonschema.ValidationError(f"no schema for kind {kind!r}; known: {sorted(schemas())}")
    error = jsonschema.exceptions.best_match(_validator(kind).iter_errors(resource))
    if error is not None:
        raise error


def load_crd(path: Path = CRD) -> dict[str, Any]:
    """The CRD file (1 MB of YAML: libyaml's loader when PyYAML has it)."""
    import yaml

    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
