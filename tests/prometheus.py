"""A real Prometheus for the tests: the dashboard's queries and the alert rules' queries, and a server scraping an
app's metrics endpoint.

The binaries come from Debian's `prometheus` package (it brings `promtool`); `make test` installs it where it can
(as root on Debian). Without them the tests that need them are skipped with the install command, unless
`FAIRSHARE_REQUIRE_PROMETHEUS=1` (CI sets it), where they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from harness.net import free_port
from harness.processes import service

REPO = Path(__file__).resolve().parents[1]
ALERT_RULES = REPO / "observability" / "prometheus" / "fairshare-alerts.yaml"
ALERT_TESTS = REPO / "observability" / "prometheus" / "fairshare-alerts.test.yaml"
DASHBOARD = REPO / "observability" / "grafana" / "fairshare-dashboard.json"
RATE_INTERVAL = "1m"
"""What Grafana's `$__rate_interval` stands for when a test runs a dashboard query."""
INSTALL = "apt-get install prometheus (Debian's package; it brings promtool)"
ALERT_FORM = re.compile(r"^(?P<query>.+?)\s*(?P<op>[<>]=?|==|!=)\s*(?P<threshold>-?[0-9.]+)$", re.DOTALL)
"""Every alert expression is `<query> <comparison> <threshold>`: the query alone must return series."""


def binary(name: str) -> str:
    """The path of `prometheus` or `promtool`, or skip (fail where CI requires it) with how to install it."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed: {INSTALL}"
        if os.environ.get("FAIRSHARE_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def dashboard_queries() -> dict[str, str]:
    """Every query of the Grafana dashboard, by panel title and target, `$__rate_interval` filled in."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {
        f"{p['title']} [{t['refId']}]": t["expr"].replace("$__rate_interval", RATE_INTERVAL)
        for p in panels
        for t in p.get("targets", [])
    }


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERT_RULES.read_text())["groups"] for rule in group["rules"]]


def alert_query(expr: str) -> str:
    """The query an alert compares with its threshold (ValueError if the expression has another form)."""
    m = ALERT_FORM.match(expr.strip())
    if m is None:
        raise ValueError(f"alert expression is not `<query> <comparison> <threshold>`: {expr!r}")
    return m["query"]


class Prometheus:
    """A Prometheus server on a free loopback port (`running`)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The series an instant query returns (an error from Prometheus raises)."""
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        body = r.json()
        if body.get("status") != "success":
            raise AssertionError(f"{promql!r}: {body.get('errorType')}: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def rules(self) -> list[dict[str, Any]]:
        groups = httpx.get(f"{self.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = httpx.get(f"{self.url}/api/v1/targets", timeout=10).json()["data"][
            "activeTargets"
        ]
        return active


@contextlib.contextmanager
def running(scrape: str, rule_files: list[Path], workdir: Path, ready_timeout_s: float = 60) -> Iterator[Prometheus]:
    """Prometheus scraping `scrape` (host:port) every second and evaluating `rule_files` every second; stopped
    (its process group) on exit."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [{"job_name": "ray", "static_configs": [{"targets": [scrape]}]}],
    }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    cmd = [
        binary("prometheus"),
        f"--config.file={config_path}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    server = Prometheus(f"http://127.0.0.1:{port}")

    def ready() -> bool:
        return httpx.get(f"{server.url}/-/ready", timeout=2).status_code == 200

    with service(cmd, workdir / "prometheus.log", ready, ready_timeout_s, stop_timeout_s=20):
        yield server
