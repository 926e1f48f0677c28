"""The alert rules and the dashboard as files: `promtool check rules` and `promtool test rules` pass (each alert
fires on what should fire it and stays silent otherwise), every alert has the form the live test evaluates, and
every query names only metrics the app or Serve exports. The live check against a running app:
tests/serve/test_prometheus.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests import prometheus

EXPORTED = re.compile(r"ray_(fairshare_[a-z_]+|serve_[a-z_]+)")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([prometheus.binary("promtool"), *args], capture_output=True, text=True, timeout=120)


def test_promtool_checks_the_alert_rules() -> None:
    done = _promtool("check", "rules", str(prometheus.ALERT_RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(prometheus.alert_rules())} rules found" in done.stdout


def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    done = _promtool("test", "rules", str(prometheus.ALERT_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_fail_on_a_changed_threshold(tmp_path) -> None:
    """The unit tests can fail: with a threshold the series no longer cross, the firing cases do not fire."""
    rules = tmp_path / prometheus.ALERT_RULES.name
    rules.write_text(prometheus.ALERT_RULES.read_text().replace("> 0.05", "> 0.5"))
    tests = tmp_path / prometheus.ALERT_TESTS.name
    tests.write_text(prometheus.ALERT_TESTS.read_text())
    done = _promtool("test", "rules", str(tests))
    assert done.returncode != 0 and "FairshareTargetCannotBeMet" in done.stdout + done.stderr


def test_every_alert_is_a_query_compared_with_a_threshold() -> None:
    rules = prometheus.alert_rules()
    assert {r["alert"] for r in rules} >= {
        "FairshareTargetCannotBeMet",
        "FairshareSloAttainmentLow",
        "FairshareShedding",
        "FairshareEngineNotReady",
    }
    for rule in rules:
        assert prometheus.alert_query(rule["expr"]), rule["alert"]
    with pytest.raises(ValueError, match="not `<query> <comparison> <threshold>`"):
        prometheus.alert_query("absent(up)")


def test_the_dashboard_and_alerts_use_only_exported_metrics() -> None:
    """Each metric a query names is defined by the app (serve_app/metrics.py) or by Ray Serve (Ray adds `ray_`)."""
    import ray.serve

    from serve_app import metrics

    ours = Path(metrics.__file__).read_text()
    serves = "".join(p.read_text() for p in (Path(ray.serve.__file__).parent / "_private").glob("*.py"))
    queries = [*prometheus.dashboard_queries().values(), *(r["expr"] for r in prometheus.alert_rules())]
    assert len(prometheus.dashboard_queries()) >= 12
    for query in queries:
        for name in EXPORTED.findall(query):
            base = re.sub(r"_(bucket|count|sum)$", "", name)
            assert f'"{base}"' in (serves if name.startswith("serve_") else ours), f"{name} in {query!r}"
