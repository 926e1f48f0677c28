"""`k8s/`: every manifest parses, each rendered overlay validates against KubeRay's CRD (closed) and the rules
in `rules.py`, its `serveConfigV2` is the Serve config file it names, and a broken copy of any of it fails."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ray.serve import Application
from ray.serve.schema import ServeDeploySchema

from serve_app.app import build_app
from serve_app.config import AppConfig, haproxy_binary, kuberay, validate
from serve_app.config.autoscaling import SLO_POLICY_FUNCTION
from serve_app.config.check import problems
from tests.k8s import rules
from tests.k8s.kustomize import KustomizeError, render
from tests.k8s.overlays import DIRECTORIES, K8S, OVERLAYS, rendered
from tests.k8s.schemas import VENDORED, load_crd, schema_from_crd
from tests.k8s.schemas import validate as validate_resource

REPO = Path(__file__).resolve().parents[2]
KINDS = {
    "base": {"RayService"},
    "gpu": {"RayService", "PersistentVolumeClaim", "Job", "PodMonitor", "PrometheusRule"},
    "cpu-demo": {"RayService"},
}
RULES = [
    rules.env_problems,
    rules.capacity_problems,
    rules.gpu_problems,
    rules.shutdown_problems,
    rules.probe_problems,
    rules.resource_problems,
    rules.service_problems,
    rules.storage_problems,
    rules.monitoring_problems,
]


def test_every_manifest_parses() -> None:
    files = sorted(K8S.rglob("*.yaml"))
    assert len(files) >= 10
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs, path
        for doc in docs:
            if isinstance(doc, list):  # a JSON patch
                assert all({"op", "path"} <= set(op) for op in doc), path
            else:
                assert {"apiVersion", "kind"} <= set(doc), path


def test_kustomizations_match_the_kinds_documented() -> None:
    assert set(DIRECTORIES) == {"base"} | {p.name for p in (K8S / "overlays").iterdir() if p.is_dir()}
    for name in DIRECTORIES:
        assert {r["kind"] for r in rendered(name)} == KINDS[name]


@pytest.mark.parametrize("name", sorted(DIRECTORIES))
def test_rendered_resources_validate_against_the_closed_schemas(name: str) -> None:
    for resource in rendered(name):
        validate_resource(resource)


MUTATIONS: dict[str, tuple[str, Callable[[dict[str, Any]], None]]] = {
    # misspelled fields, at every depth
    "spec field": (
        "RayService",
        lambda r: _rename(r["spec"], "rayClusterDeletionDelaySeconds", "rayClusterDeletionDelay"),
    ),
    "cluster field": (
        "RayService",
        lambda r: _rename(_cluster(r), "enableInTreeAutoscaling", "enableInTreeAutoScaling"),
    ),
    "group field": ("RayService", lambda r: _rename(_group(r), "minReplicas", "minReplica")),
    "container field": ("RayService", lambda r: _rename(_worker(r), "resources", "resource")),
    "probe field": ("RayService", lambda r: _rename(_head(r)["livenessProbe"], "periodSeconds", "periodSecond")),
    "service field": ("RayService", lambda r: _rename(r["spec"]["serveService"]["spec"]["ports"][0], "port", "prot")),
    "metadata field": ("RayService", lambda r: _rename(r["metadata"], "name", "nmae")),
    "autoscaler field": (
        "RayService",
        lambda r: _rename(_cluster(r)["autoscalerOptions"], "idleTimeoutSeconds", "idleTimeout"),
    ),
    "job field": ("Job", lambda r: _rename(r["spec"], "backoffLimit", "backofLimit")),
    "job pod field": ("Job", lambda r: _rename(r["spec"]["template"]["spec"], "restartPolicy", "restartPolicies")),
    "claim field": ("PersistentVolumeClaim", lambda r: _rename(r["spec"], "accessModes", "accessMode")),
    # wrong types
    "replicas as text": ("RayService", lambda r: _group(r).update(maxReplicas="8")),
    "env value as bool": ("RayService", lambda r: _worker(r)["env"][0].update(value=True)),
    "grace period as text": (
        "RayService",
        lambda r: _group(r)["template"]["spec"].update(terminationGracePeriodSeconds="180"),
    ),
    "memory in GB": ("RayService", lambda r: _worker(r)["resources"]["limits"].update(memory="64GB")),
    "image as number": ("RayService", lambda r: _head(r).update(image=5)),
    "ray start param as int": (
        "RayService",
        lambda r: _cluster(r)["headGroupSpec"]["rayStartParams"].update({"num-gpus": 0}),
    ),
    "serveConfigV2 as a mapping": ("RayService", lambda r: r["spec"].update(serveConfigV2={"applications": []})),
    "tolerations as a mapping": ("RayService", lambda r: _group(r)["template"]["spec"].update(tolerations={})),
    "wrong apiVersion": ("RayService", lambda r: r.update(apiVersion="ray.io/v1alpha1")),
    "claim size as a list": ("PersistentVolumeClaim", lambda r: r["spec"]["resources"].update(requests=[])),
    "pod monitor endpoint field": (
        "PodMonitor",
        lambda r: _rename(r["spec"]["podMetricsEndpoints"][0], "port", "prot"),
    ),
    "pod monitor without endpoints": ("PodMonitor", lambda r: r["spec"].update(podMetricsEndpoints=[])),
    "rule field": ("PrometheusRule", lambda r: _rename(r["spec"]["groups"][0]["rules"][0], "expr", "expression")),
    "rule label as a number": ("PrometheusRule", lambda r: r["spec"]["groups"][0]["rules"][0]["labels"].update(x=1)),
}


def _rename(mapping: dict[str, Any], old: str, new: str) -> None:
    mapping[new] = mapping.pop(old)


def _cluster(rs: dict[str, Any]) -> dict[str, Any]:
    return rs["spec"]["rayClusterConfig"]


def _group(rs: dict[str, Any]) -> dict[str, Any]:
    return _cluster(rs)["workerGroupSpecs"][0]


def _head(rs: dict[str, Any]) -> dict[str, Any]:
    return _cluster(rs)["headGroupSpec"]["template"]["spec"]["containers"][0]


def _worker(rs: dict[str, Any]) -> dict[str, Any]:
    return _group(rs)["template"]["spec"]["containers"][0]


def test_the_crd_alone_accepts_a_misspelled_field() -> None:
    """Why the schemas are closed: the API server would prune the field and the setting would vanish."""
    rs = rules.ray_service(rendered("gpu"))
    _rename(_worker(rs), "resources", "resource")
    jsonschema.Draft7Validator(json.loads(VENDORED.read_text())).validate(rs)
    with pytest.raises(jsonschema.ValidationError, match="'resource' was unexpected"):
        validate_resource(rs)


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_misspelled_field_or_a_wrong_type_is_rejected(mutation: str) -> None:
    kind, mutate = MUTATIONS[mutation]
    resource = next(r for r in rendered("gpu") if r["kind"] == kind)  # the first of its kind (two Jobs)
    validate_resource(resource)
    mutate(resource)
    with pytest.raises(jsonschema.ValidationError):
        validate_resource(resource)


def test_an_unknown_kind_is_rejected() -> None:
    with pytest.raises(jsonschema.ValidationError, match="no schema for kind 'ConfigMap'"):
        validate_resource({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})


# -- serveConfigV2 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OVERLAYS)
def test_serve_config_validates_with_serve_and_builds_with_our_config(name: str) -> None:
    config = rules.serve_config(rules.ray_service(rendered(name)))
    schema = ServeDeploySchema.model_validate(config)
    assert problems(config) == []
    for app in schema.applications:
        validate(AppConfig, app.args, "args")
        assert isinstance(build_app(app.args), Application)


def _leaves(node: Any, path: tuple = ()) -> dict[tuple, Any]:
    """Every scalar by path; applications and deployments are keyed by name, so their order does not matter."""
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in _leaves(value, (*path, key)).items()}
    if isinstance(node, list) and all(isinstance(v, dict) and "name" in v for v in node) and node:
        return {k: v for item in node for k, v in _leaves(item, (*path, item["name"])).items()}
    if isinstance(node, list):
        return {k: v for i, item in enumerate(node) for k, v in _leaves(item, (*path, i)).items()}
    return {path: node}


@pytest.mark.parametrize("name", OVERLAYS)
def test_serve_config_is_the_config_file_with_only_the_cluster_changes(name: str) -> None:
    """Derived from the file, not from a copy of it: a knob added to the file must reach the manifest."""
    source = yaml.safe_load((REPO / kuberay.OVERLAYS[name].source).read_text())
    cluster = rules.serve_config(rules.ray_service(rendered(name)))
    want, got = _leaves(source), _leaves(cluster)
    host = ("http_options", "host")
    assert got.pop(host) == "0.0.0.0"
    want.pop(host, None)
    # The images' HAProxy (splice off), which a laptop's config cannot name.
    assert got.pop(("controller_options", "runtime_env", "env_vars", haproxy_binary.ENV)) == haproxy_binary.IMAGE_PATH
    for app in source["applications"]:
        for deployment in app.get("deployments", []):
            if deployment["name"] != kuberay.ENGINE or "autoscaling_config" in deployment:
                continue
            prefix = ("applications", app["name"], "deployments", deployment["name"])
            replicas = want.pop((*prefix, "num_replicas"), 1)
            scaling = {k[-1]: got.pop(k) for k in list(got) if k[: len(prefix) + 1] == (*prefix, "autoscaling_config")}
            assert scaling["min_replicas"] == scaling["initial_replicas"] == replicas
            assert scaling["max_replicas"] >= replicas
            # Shipped on the SLO policy (it won the autoscaling benchmark); `requests` is the switch back.
            assert scaling["policy_function"] == SLO_POLICY_FUNCTION and "target_ongoing_requests" not in scaling
    assert got == want


def _engine_scaling(config: dict[str, Any]) -> dict[str, Any]:
    scaling: dict[str, Any] = next(d for d in rules.deployments(config) if d["name"] == kuberay.ENGINE)[
        "autoscaling_config"
    ]
    return scaling


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_slo_policy_switch_keeps_the_bounds_and_scales_on_the_service_levels(name: str) -> None:
    """The switch: the same bounds and delays, Serve's own policy at the overlay's target instead of the SLO policy."""
    overlay = kuberay.OVERLAYS[name]
    raw = yaml.safe_load((REPO / overlay.source).read_text())
    assert overlay.scaling.policy == "slo"
    slo = _engine_scaling(kuberay.serve_config(raw, overlay.scaling))
    requests_scaling = overlay.scaling.model_copy(update={"policy": "requests"})
    requests = _engine_scaling(kuberay.serve_config(raw, requests_scaling))
    assert slo["policy"]["policy_function"] == SLO_POLICY_FUNCTION and "target_ongoing_requests" not in slo
    assert "policy" not in requests and requests["target_ongoing_requests"] == overlay.scaling.target_ongoing_requests
    assert {k: v for k, v in slo.items() if k != "policy"} == {
        k: v for k, v in requests.items() if k != "target_ongoing_requests"
    }
    assert problems(kuberay.serve_config(raw, requests_scaling)) == []
    engine = next(d for d in rules.deployments(raw) if d["name"] == kuberay.ENGINE)
    assert 0 < requests["target_ongoing_requests"] <= engine.get("max_ongoing_requests", 5)
    args = raw["applications"][0].get("args", {})
    running = args.get("sglang", {}).get("max_running_requests")
    if args.get("backend") == "sglang" and running:
        assert requests["target_ongoing_requests"] <= running, "scale before sglang queues requests"


@pytest.mark.parametrize("name", OVERLAYS)
def test_a_serve_scale_up_reaches_worker_pods(name: str) -> None:
    """An Engine replica Serve adds waits for a pod's resources: KubeRay's in-tree autoscaler adds a pod to a worker
    group whose pods hold one, and that group may grow."""
    rs = rules.ray_service(rendered(name))
    assert rs["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    engine = next(d for d in rules.deployments(rules.serve_config(rs)) if d["name"] == kuberay.ENGINE)
    least, most = rules.replica_bounds(engine)
    assert most > least
    fits = [
        pod
        for pod in rules.ray_pods(rs)[1:]
        if all(rules.actor_resource(engine, r) <= pod.ray_resource(r) for r in ("CPU", "GPU"))
    ]
    assert any(pod.replicas[1] > pod.replicas[0] for pod in fits)


def test_a_bad_slo_policy_knob_in_a_config_file_is_caught() -> None:
    raw = yaml.safe_load((REPO / kuberay.OVERLAYS["gpu"].source).read_text())
    config = kuberay.serve_config(raw, kuberay.OVERLAYS["gpu"].scaling.model_copy(update={"policy": "slo"}))
    assert problems(config) == []
    _engine_scaling(config)["policy"]["policy_kwargs"] = {"down_ttft_fraction": 0.95}
    assert any("down_ttft_fraction" in p for p in problems(config))


@pytest.mark.parametrize("name", OVERLAYS)
def test_checked_in_serve_config_patch_is_up_to_date(name: str) -> None:
    path = kuberay.patch_path(name)
    assert path.read_text() == kuberay.patch_text(name, kuberay.OVERLAYS[name]), (
        f"{path.relative_to(REPO)} is stale: run `python -m serve_app.config.kuberay`"
    )


def test_checked_in_prometheus_rule_is_the_alert_rules_file() -> None:
    path = REPO / kuberay.PROMETHEUS_RULE
    assert path.read_text() == kuberay.prometheus_rule_text(), f"{kuberay.PROMETHEUS_RULE} is stale"
    rule = yaml.safe_load(path.read_text())
    assert rule["spec"]["groups"] == yaml.safe_load((REPO / kuberay.ALERT_RULES).read_text())["groups"]


def test_generator_refuses_a_config_that_fails_the_check(tmp_path: Path) -> None:
    raw = yaml.safe_load((REPO / "config.gpu.yaml").read_text())
    engine = next(d for d in raw["applications"][0]["deployments"] if d["name"] == kuberay.ENGINE)
    engine["user_config"]["long_lane_replica"] = 2  # a typo our EngineKnobs refuses
    (tmp_path / "config.gpu.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="long_lane_replica"):
        kuberay.patch_text("gpu", kuberay.OVERLAYS["gpu"], repo=tmp_path)


def test_generator_check_mode_reports_a_stale_patch(tmp_path: Path, capsys) -> None:
    shutil.copytree(K8S, tmp_path / "k8s")
    shutil.copytree(REPO / "observability", tmp_path / "observability")
    for name in ("config.yaml", "config.gpu.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    assert kuberay.main([], tmp_path) == 0
    assert kuberay.main(["--check"], tmp_path) == 0
    config = tmp_path / "config.yaml"
    config.write_text(config.read_text().replace("default_max_tokens: 256", "default_max_tokens: 300"))
    alerts = tmp_path / kuberay.ALERT_RULES
    alerts.write_text(alerts.read_text().replace("for: 15m", "for: 20m"))
    assert kuberay.main(["--check"], tmp_path) == 1
    assert capsys.readouterr().out.splitlines() == [
        "k8s/overlays/cpu-demo/serve-config.yaml: stale (run `python -m serve_app.config.kuberay`)",
        f"{kuberay.PROMETHEUS_RULE}: stale (run `python -m serve_app.config.kuberay`)",
    ]
    assert kuberay.main([], tmp_path) == 0
    assert kuberay.main(["--check"], tmp_path) == 0
    assert "for: 20m" in (tmp_path / kuberay.PROMETHEUS_RULE).read_text()


@pytest.mark.parametrize(
    "where, change",
    [
        ("deployment key Serve would drop", lambda d: d.update(max_ongoing_request=5)),
        ("policy knob", lambda d: d["user_config"]["policy"].update(skip_ahed=False)),
        ("wrong type", lambda d: d.update(max_queued_requests="many")),
    ],
)
def test_a_broken_serve_config_in_the_manifest_is_caught(where: str, change: Callable) -> None:
    rs = rules.ray_service(rendered("gpu"))
    config = rules.serve_config(rs)
    change(next(d for d in rules.deployments(config) if d["name"] == kuberay.ENGINE))
    assert problems(config), where


# -- the rules -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OVERLAYS)
@pytest.mark.parametrize("rule", RULES, ids=lambda f: f.__name__)
def test_overlay_satisfies_rule(name: str, rule: Callable) -> None:
    assert rule(rendered(name)) == []


def _set_env(resources: list[dict[str, Any]], name: str, value: Any) -> None:
    env = rules.ray_pods(rules.ray_service(resources))[1].ray_container["env"]
    env[:] = [e for e in env if e["name"] != name] + [{"name": name, "value": value}]


def _serve_deployment(resources: list[dict[str, Any]], deployment: str, **changes: Any) -> None:
    rs = rules.ray_service(resources)
    config = rules.serve_config(rs)
    next(d for d in rules.deployments(config) if d["name"] == deployment).update(changes)
    rs["spec"]["serveConfigV2"] = yaml.safe_dump(config)


def _drop_plugin_switch(resources: list[dict[str, Any]]) -> None:
    head = rules.ray_pods(rules.ray_service(resources))[0].ray_container
    head["env"] = [e for e in head["env"] if e["name"] != "FAIRSHARE_PLUGIN_FORCE"]


BREAKAGES: dict[str, tuple[Callable, Callable[[list[dict[str, Any]]], None], str]] = {
    "misspelled policy variable": (
        rules.env_problems,
        lambda r: _set_env(r, "FAIRSHARE_SKIP_AHEED", "false"),
        "is not a PolicyConfig field",
    ),
    "policy value of the wrong type": (
        rules.env_problems,
        lambda r: _set_env(r, "FAIRSHARE_LOOKAHEAD", "many"),
        "lookahead",
    ),
    "policy values that contradict": (
        rules.env_problems,
        lambda r: (
            _set_env(r, "FAIRSHARE_CHUNK_BUDGET_TOKENS", "256"),
            _set_env(r, "FAIRSHARE_INTERACTIVE_PASS_TOKENS", "512"),
        ),
        "exceeds chunk_budget_tokens",
    ),
    "plugin switch not a boolean": (
        rules.env_problems,
        lambda r: _set_env(r, "FAIRSHARE_PLUGIN_ENABLED", "maybe"),
        "boolean",
    ),
    "plugin switch missing": (rules.env_problems, _drop_plugin_switch, "FAIRSHARE_PLUGIN_FORCE missing"),
    "too few GPU pods for Serve's maximum": (
        rules.capacity_problems,
        lambda r: _group(rules.ray_service(r)).update(maxReplicas=6),
        "GPU at max",
    ),
    "too few GPU pods for Serve's minimum": (
        rules.capacity_problems,
        lambda r: _group(rules.ray_service(r)).update(minReplicas=2),
        "GPU at min",
    ),
    "two GPUs per pod": (
        rules.gpu_problems,
        lambda r: _worker(rules.ray_service(r))["resources"]["limits"].update({rules.GPU: 2}),
        "GPU per pod",
    ),
    "a head with GPUs": (
        rules.gpu_problems,
        lambda r: _cluster(rules.ray_service(r))["headGroupSpec"]["rayStartParams"].update({"num-gpus": "1"}),
        "head advertises GPUs",
    ),
    "grace period shorter than the drain": (
        rules.shutdown_problems,
        lambda r: _serve_deployment(r, kuberay.ENGINE, graceful_shutdown_timeout_s=600),
        "terminationGracePeriodSeconds",
    ),
    "old cluster deleted before its streams end": (
        rules.shutdown_problems,
        lambda r: rules.ray_service(r)["spec"].update(rayClusterDeletionDelaySeconds=30),
        "rayClusterDeletionDelaySeconds",
    ),
    "readiness on the Serve app": (
        rules.probe_problems,
        lambda r: _worker(rules.ray_service(r))["readinessProbe"]["exec"].update(
            command=["bash", "-c", "wget -q -O- http://localhost:8000/-/healthz"]
        ),
        "Ray's health endpoints",
    ),
    "liveness that kills a loading pod": (
        rules.probe_problems,
        lambda r: _worker(rules.ray_service(r))["livenessProbe"].update(failureThreshold=3),
        "livenessProbe gives up",
    ),
    "no startup probe": (
        rules.probe_problems,
        lambda r: _head(rules.ray_service(r)).pop("startupProbe"),
        "no startupProbe",
    ),
    "no memory limit": (
        rules.resource_problems,
        lambda r: _worker(rules.ray_service(r))["resources"]["limits"].pop("memory"),
        "memory request and limit",
    ),
    "request above limit": (
        rules.resource_problems,
        lambda r: _head(rules.ray_service(r))["resources"]["requests"].update(memory="32Gi"),
        "memory request above",
    ),
    "proxy on loopback": (rules.service_problems, lambda r: _serve_http(r, host="127.0.0.1"), "proxy host"),
    "proxy port not the Service's": (rules.service_problems, lambda r: _serve_http(r, port=9000), "proxy port"),
    "model path off the volume": (rules.storage_problems, lambda r: _model_path(r, "/data/model"), "no mounted claim"),
    "model volume not mounted on the head": (
        rules.storage_problems,
        lambda r: _head(rules.ray_service(r)).pop("volumeMounts"),
        "head: /models",
    ),
    "token not from a Secret": (
        rules.storage_problems,
        lambda r: next(x for x in r if x["kind"] == "Job")["spec"]["template"]["spec"]["containers"][0].update(
            env=[{"name": "HF_TOKEN", "value": "hf_x"}]
        ),
        "HF_TOKEN",
    ),
    "a worker group without the metrics port": (
        rules.monitoring_problems,
        lambda r: _worker(rules.ray_service(r)).pop("ports"),
        "no container port 'metrics'",
    ),
    "metrics exported on another port": (
        rules.monitoring_problems,
        lambda r: _group(rules.ray_service(r))["rayStartParams"].update({"metrics-export-port": "9090"}),
        "not Ray's metrics-export-port",
    ),
    "a pod the monitor does not select": (
        rules.monitoring_problems,
        lambda r: _group(rules.ray_service(r))["template"]["metadata"]["labels"].update(
            {"app.kubernetes.io/name": "other"}
        ),
        "not selected by PodMonitor",
    ),
}


def _serve_http(resources: list[dict[str, Any]], **changes: Any) -> None:
    rs = rules.ray_service(resources)
    config = rules.serve_config(rs)
    config["http_options"].update(changes)
    rs["spec"]["serveConfigV2"] = yaml.safe_dump(config)


def _model_path(resources: list[dict[str, Any]], path: str) -> None:
    rs = rules.ray_service(resources)
    config = rules.serve_config(rs)
    config["applications"][0]["args"]["sglang"]["model_path"] = path
    rs["spec"]["serveConfigV2"] = yaml.safe_dump(config)


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_overlay_breaks_its_rule(breakage: str) -> None:
    rule, breaks, message = BREAKAGES[breakage]
    resources = rendered("gpu")
    breaks(resources)
    found = rule(resources)
    assert any(message in line for line in found), found


# -- kustomize -------------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="cross-check with the real kustomize needs kubectl")
@pytest.mark.parametrize("name", sorted(DIRECTORIES))
def test_python_rendering_equals_kubectl_kustomize(name: str) -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(DIRECTORIES[name])], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    real = [d for d in yaml.safe_load_all(out) if d is not None]

    def key(r: dict[str, Any]) -> tuple[str, str]:
        return r["kind"], r["metadata"]["name"]

    assert {key(r): r for r in rendered(name)} == {key(r): r for r in real}


def test_renderer_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\n")
    (tmp_path / "kustomization.yaml").write_text("resources: [r.yaml]\nnamePrefix: demo-\n")
    with pytest.raises(KustomizeError, match="namePrefix"):
        render(tmp_path)
    (tmp_path / "p.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {l: [1]}\n")
    (tmp_path / "kustomization.yaml").write_text("resources: [r.yaml]\npatches: [{path: p.yaml}]\n")
    with pytest.raises(KustomizeError, match="list"):
        render(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [r.yaml]\npatches: [{patch: '[{op: add, path: /data/c, value: d}]', target: {kind: Secret}}]\n"
    )
    with pytest.raises(KustomizeError, match="no resource matches"):
        render(tmp_path)


# -- the vendored schema ---------------------------------------------------------------------------------


def test_vendored_schema_is_kuberays_crd() -> None:
    assert json.loads(VENDORED.read_text()) == schema_from_crd(load_crd())
