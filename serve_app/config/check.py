"""Check a Serve config file before deploying it: `python -m serve_app.config.check config.yaml`.

Validates the file with Serve's own schema (`ServeDeploySchema`), refuses keys Serve would silently
drop in our deployments, then validates our typed sections (`args`, both `user_config`s, the policy
overrides, the SLO autoscaling policy's `policy_kwargs`: `autoscaling_problems`), checks that the Ingress
drains at least as long as the Engine (`drain_problems`) and that the controller and the application ask
for the same front (`serve_path.front_problems`) and the same ingress drain (`serve_path.ingress_drain_problems`).
Prints one line per problem, naming the field, and exits non-zero if there is any.
A bad `user_config` sent to a running app fails the update (Serve then replaces the replica that
refused it), so check first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from ray.serve._private.constants import DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S
from ray.serve.schema import DeploymentSchema, ServeDeploySchema

from serve_app.config import (
    AppConfig,
    ConfigError,
    EngineKnobs,
    RoutingKnobs,
    describe_validation_error,
    engine_policy,
    validate,
)
from serve_app.config.autoscaling import SLO_POLICY_FUNCTION, slo_scaling_knobs
from serve_app.config.serve_path import env_vars_of, front_problems, ingress_drain_problems

DEPLOYMENTS: dict[str, type[RoutingKnobs] | type[EngineKnobs] | None] = {
    "Ingress": RoutingKnobs,
    "Engine": EngineKnobs,
    "Embedder": None,  # no user_config: its settings are `args.embeddings`
}


def drain_problems(where: str, deployments: list[dict[str, Any]]) -> list[str]:
    """Every stream an Engine replica serves is relayed by an Ingress replica: when Serve stops both (the app is
    deleted or upgraded, a node goes away), the Ingress must keep relaying for as long as the Engine drains, or
    the engine's drain finishes streams no client receives."""
    drain_s = {
        d.get("name"): d.get("graceful_shutdown_timeout_s", DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S) for d in deployments
    }
    ingress_s = drain_s.get("Ingress", DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S)
    engine_s = drain_s.get("Engine", DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S)
    if ingress_s < engine_s:
        return [
            f"{where}.Ingress: graceful_shutdown_timeout_s={ingress_s} is below the Engine's ({engine_s}); "
            "streams the engines finish while draining would be cut at the ingress"
        ]
    return []


def autoscaling_problems(where: str, deployment: dict[str, Any]) -> list[str]:
    """The SLO autoscaling policy's knobs, as the policy reads them in Serve's controller (where a bad one would only
    be logged, the deployment held at its replica count); and only the Engine publishes the signals it reads."""
    policy = (deployment.get("autoscaling_config") or {}).get("policy") or {}
    if policy.get("policy_function") != SLO_POLICY_FUNCTION:
        return []
    name = deployment.get("name")
    if name != "Engine":
        return [f"{where}.{name}: the SLO autoscaling policy reads what Engine replicas publish; {name} publishes none"]
    try:
        slo_scaling_knobs(policy.get("policy_kwargs"))
    except ConfigError as e:
        return [f"{where}.{e}"]
    return []


def problems(raw: dict[str, Any]) -> list[str]:
    try:
        schema = ServeDeploySchema.model_validate(raw)
    except ValidationError as e:
        return [describe_validation_error("file", e)]
    out: list[str] = []
    for app_raw, app in zip(raw.get("applications", []), schema.applications, strict=True):
        where = f"applications[{app.name}]"
        try:
            cfg: AppConfig = validate(AppConfig, app.args, f"{where}.args")
        except ConfigError as e:
            out.append(str(e))
            cfg = AppConfig()
        out += drain_problems(where, app_raw.get("deployments", []))
        controller, app_env = raw.get("controller_options"), env_vars_of(app_raw)
        out += [
            f"{where}: {p}" for p in front_problems(controller, app_env) + ingress_drain_problems(controller, app_env)
        ]
        for d in app_raw.get("deployments", []):
            name = d.get("name")
            if name not in DEPLOYMENTS:
                out.append(f"{where}.deployments: unknown deployment {name!r}; expected {sorted(DEPLOYMENTS)}")
                continue
            unknown = sorted(set(d) - set(DeploymentSchema.model_fields))
            if unknown:
                out.append(f"{where}.{name}: keys Serve would ignore: {unknown}")
            out += autoscaling_problems(where, d)
            knobs_model = DEPLOYMENTS[name]
            if knobs_model is None:
                if name == "Embedder" and cfg.embeddings is None:
                    out.append(f"{where}.Embedder: the app runs no Embedder without args.embeddings")
                if "user_config" in d:
                    out.append(f"{where}.{name}: takes no user_config")
                continue
            if "user_config" not in d:
                continue
            try:
                knobs = validate(knobs_model, d["user_config"], f"{where}.{name}.user_config")
            except ConfigError as e:
                out.append(str(e))
                continue
            if isinstance(knobs, EngineKnobs):
                try:
                    engine_policy(cfg, knobs.policy, f"{where}.{name}.user_config.policy")
                except ConfigError as e:
                    out.append(str(e))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serve_app.config.check", description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, help="a Serve config file (YAML)")
    path = parser.parse_args(argv).config
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        print(f"{path}: cannot read it as YAML: {e}", file=sys.stderr)
        return 2
    if not isinstance(loaded, dict):
        print(f"{path}: not a Serve config (a YAML mapping with `applications`)", file=sys.stderr)
        return 2
    found = problems(loaded)
    for line in found:
        print(line)
    if not found:
        print(f"{path}: ok")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
