"""The app under test: a local Ray + Serve from a deploy config (as `serve run FILE` deploys it), or a URL.

The benchmark sets what it needs explicitly (sim preset, rule set, time scale, engine replicas) on
top of the file, so it does not depend on the file's current defaults. The policy is switched live
through the `Engine` deployment's `user_config.policy` (a redeploy that changes only `user_config`
runs `reconfigure()` on the replicas; nothing restarts).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
import yaml

from harness import local_serve as sc
from harness.net import free_port
from scheduler.config import PolicyConfig
from scheduler.sglang_plugin.server_args import SGLANG_OWNED_FIELDS
from scheduler.sim.presets import PRESETS
from scheduler.sim.rules import RuleSet, policy_for

APP_READY_TIMEOUT_S = 60


def upstream_policy_overrides(preset: str) -> dict[str, Any]:
    """`user_config.policy` that turns a `fairshare` sim engine into upstream sglang's decisions on this preset:
    every `PolicyConfig` field where the `baseline` rule set differs from `fairshare` (skip-ahead, fair share and
    adaptive passes off, and upstream's own chunk size, no mixed decode, no starvation guard). Both rule sets
    keep one half-prefilled request, so the engine then runs exactly the `baseline` rule set."""
    p = PRESETS[preset]
    base, base_cut = policy_for(RuleSet.BASELINE, p)
    ours, our_cut = policy_for(RuleSet.FAIRSHARE, p)
    assert base_cut == our_cut, "the live config cannot change the half-prefilled-request limit"
    a, b = base.model_dump(), ours.model_dump()
    return {k: v for k, v in a.items() if v != b[k]}


def sglang_upstream_overrides() -> dict[str, Any]:
    """`user_config.policy` that makes the plugin take upstream sglang's decisions: the `baseline` rule set's fields
    that differ from the defaults, less those sglang's own arguments set (`SGLANG_OWNED_FIELDS`)."""
    base = policy_for(RuleSet.BASELINE, PRESETS["h100-8b"])[0].model_dump()
    default = PolicyConfig().model_dump()
    return {k: v for k, v in base.items() if v != default[k] and k not in SGLANG_OWNED_FIELDS}


def load_config(path: Path, port: int, overrides: dict[str, Any]) -> dict[str, Any]:
    """The deploy config at `path` on 127.0.0.1:`port`, with the benchmark's settings:
    `sim` (dict merged into args.sim), `engine_replicas`, `time_scale`, `policy` (merged over the file's)."""
    cfg = copy.deepcopy(yaml.safe_load(path.read_text()))
    cfg["http_options"] = {**cfg.get("http_options", {}), "host": "127.0.0.1", "port": port}
    app = cfg["applications"][0]
    args = app.setdefault("args", {})
    if args.get("backend", "sim") == "sim" and overrides.get("sim"):
        args["sim"] = {**args.get("sim", {}), **overrides["sim"]}
    engine = sc.deployment(cfg, "Engine")
    if overrides.get("engine_replicas") is not None:
        engine["num_replicas"] = overrides["engine_replicas"]
    user = engine.setdefault("user_config", {})
    if overrides.get("time_scale") is not None:
        user["time_scale"] = overrides["time_scale"]
    user["policy"] = {**(user.get("policy") or {}), **overrides.get("policy", {})}
    return cfg


class LocalApp:
    """Ray + Serve in this process, on a free loopback port; `with LocalApp(...) as app:` stops it on exit."""

    def __init__(
        self,
        config_path: Path,
        overrides: dict[str, Any],
        num_cpus: int = 4,
        edit: Callable[[dict[str, Any]], None] | None = None,
        deploy_timeout_s: float = 180,
    ) -> None:
        """`edit`: changes the benchmark makes to the loaded config (in place) before it is deployed."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = load_config(config_path, self.port, overrides)
        file_engine = sc.deployment(yaml.safe_load(config_path.read_text()), "Engine")
        self.file_policy: dict[str, Any] = dict(file_engine.get("user_config", {}).get("policy") or {})
        """The config file's engine policy: `set_policy` changes it, as the benchmark's `policy` override does."""
        if edit is not None:
            edit(self.config)
        self.num_cpus = num_cpus
        self.deploy_timeout_s = deploy_timeout_s

    def __enter__(self) -> LocalApp:
        # As `serve run` would: the file's controller options, Serve's defaults where it has none.
        options = self.config.get("controller_options") or {}
        self._use_port(sc.start_on_a_free_port(self.num_cpus, options))
        try:
            sc.deploy(self.config, timeout_s=self.deploy_timeout_s)
            wait_ready(self.url)
        except BaseException:
            sc.stop()
            raise
        return self

    def _use_port(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.config["http_options"]["port"] = port

    def __exit__(self, *exc: object) -> None:
        sc.stop()

    def set_policy(self, policy: dict[str, Any]) -> None:
        """Redeploy with the engine policy `policy` over the config file's."""
        cfg = copy.deepcopy(self.config)
        sc.deployment(cfg, "Engine")["user_config"]["policy"] = {**self.file_policy, **policy}
        sc.deploy(cfg)
        self.config = cfg


def wait_ready(url: str, timeout_s: float = APP_READY_TIMEOUT_S) -> str:
    """The served model id, once `GET /v1/models` answers."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            r = requests.get(f"{url}/v1/models", timeout=10)
            if r.status_code == 200:
                return r.json()["data"][0]["id"]
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}/v1/models did not answer in {timeout_s:.0f} s")
        time.sleep(0.5)


def engine_view(url: str, model: str) -> dict[str, Any]:
    """The admin view of the replica a probe request lands on (policy in force, active requests)."""
    r = requests.post(
        f"{url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1},
        timeout=120,
    )
    r.raise_for_status()
    view = requests.get(f"{url}/admin/replicas/{r.headers['X-Replica']}", timeout=30)
    view.raise_for_status()
    return view.json()


def wait_idle(url: str, model: str, timeout_s: float = 300) -> dict[str, Any]:
    """Wait until the engine has no request left from a previous run; returns its view."""
    deadline = time.monotonic() + timeout_s
    while True:
        view = engine_view(url, model)
        if not view.get("active_request_ids"):
            return view
        if time.monotonic() > deadline:
            raise TimeoutError(f"engine still busy after {timeout_s:.0f} s: {view.get('active_request_ids')}")
        time.sleep(1.0)
