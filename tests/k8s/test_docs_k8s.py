"""docs/kubernetes.md's commands name what the manifests define, and its plugin rollback patch applies."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonpatch
from pydantic import TypeAdapter

from serve_app.config import AppConfig
from tests.k8s import rules
from tests.k8s.overlays import rendered
from tests.k8s.schemas import validate

REPO = Path(__file__).resolve().parents[2]
PAGE = (REPO / "docs" / "kubernetes.md").read_text()


def test_rollback_patch_turns_the_plugin_off_in_every_ray_container() -> None:
    (ops,) = re.findall(r"kubectl patch rayservice fairshare --type=json -p '(.*?)'", PAGE, re.DOTALL)
    rs = jsonpatch.apply_patch(rules.ray_service(rendered("gpu")), json.loads(ops))  # its `test` ops must hold
    validate(rs)
    assert rules.env_problems([rs]) == []
    for pod in rules.ray_pods(rs):
        env = {e["name"]: e.get("value") for e in pod.ray_container["env"]}
        assert TypeAdapter(bool).validate_strings(env["FAIRSHARE_PLUGIN_ENABLED"]) is False, pod.group


def test_model_storage_selector_picks_the_volume_and_the_job_only() -> None:
    (values,) = re.findall(r"-l 'app\.kubernetes\.io/component in \(([^)]*)\)'", PAGE)
    wanted = set(values.split(","))
    picked = {
        r["kind"]
        for r in rendered("gpu")
        if r["metadata"].get("labels", {}).get("app.kubernetes.io/component") in wanted
    }
    assert picked == {"PersistentVolumeClaim", "Job"}


def test_commands_name_what_the_manifests_define() -> None:
    resources = rendered("gpu")
    rs = rules.ray_service(resources)
    jobs = [r["metadata"]["name"] for r in resources if r["kind"] == "Job"]
    assert jobs and all(f"job/{job}" in PAGE for job in jobs)
    assert f"rayservice/{rs['metadata']['name']}" in PAGE
    assert f"svc/{rs['spec']['serveService']['metadata']['name']}" in PAGE
    (app,) = rules.serve_config(rs)["applications"]
    assert f'"model": "{AppConfig.model_validate(app["args"]).served_model_id}"' in PAGE
