"""CI smoke run: Locust, headless for ~30 s, against the sim app started here (127.0.0.1, a free port).

The whole chain a user drives: Locust's streaming users -> Serve's HTTP proxy -> ingress -> lane router
-> sim engine replicas. Asserts what must hold whatever the timing: no failure, every custom metric
recorded for both traffic classes, and each stream's own figures consistent. Bounded: Locust stops
itself after `--run-time`, and the subprocess has a hard timeout.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.app import LocalApp
from loadtests.recording import METRIC_TYPES, read_samples
from loadtests.settings import to_flags

REPO = Path(__file__).resolve().parents[2]
RUN_S = 30
TIME_SCALE = 0.05
CHAT_MAX_TOKENS = 16
DOC_MAX_TOKENS = 24

pytestmark = pytest.mark.serve


@pytest.fixture(scope="module")
def app():
    overrides = {
        "sim": {"preset": "card12gb-27b", "rules": "fairshare", "natural_output_tokens": 4096},
        "engine_replicas": 2,  # a long lane and a chat lane, as the laptop config ships
        "time_scale": TIME_SCALE,
    }
    with LocalApp(REPO / "config.yaml", overrides, num_cpus=2) as local:
        yield local


def test_locust_smoke(app, tmp_path: Path) -> None:
    samples = tmp_path / "samples.jsonl"
    options = {
        "doc_tokens": "20000:40000",  # ~15-30 engine s of prefill: about 1-1.5 s at this time scale
        "doc_followups": 1,
        "doc_max_tokens": DOC_MAX_TOKENS,
        "chat_turns": 3,
        "chat_max_tokens": CHAT_MAX_TOKENS,
        "think_s": "10:30",
        "time_scale": TIME_SCALE,
        "chat_weight": 2,
        "doc_weight": 1,
        "samples_file": str(samples),
    }
    cmd = [
        sys.executable, "-m", "locust", "-f", str(REPO / "loadtests" / "locustfile.py"), "--headless",
        "--host", app.url, "-u", "6", "-r", "6", "--run-time", f"{RUN_S}s", "--stop-timeout", "30",
        "--csv", str(tmp_path / "smoke"), "--only-summary", *to_flags(options),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=RUN_S + 120)
    failures = tmp_path / "smoke_failures.csv"
    # Locust exits 1 on any failure: say which (its failures table, our failed samples, its log's tail).
    assert proc.returncode == 0, (
        f"locust exit {proc.returncode}\n{failures.read_text() if failures.exists() else ''}\n"
        f"{[s for s in read_samples(samples) if not s.ok][:5] if samples.exists() else ''}\n{proc.stderr[-3000:]}"
    )

    with open(tmp_path / "smoke_stats.csv", newline="") as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    assert int(rows[("", "Aggregated")]["Failure Count"]) == 0
    for kind in METRIC_TYPES:
        for cls in ("short", "long"):
            assert int(rows[(kind, cls)]["Request Count"]) > 0, f"no {kind} recorded for {cls}"

    recorded = read_samples(samples)
    assert recorded and all(s.ok for s in recorded), [s for s in recorded if not s.ok][:3]
    for s in recorded:
        assert s.traffic_class in ("short", "long") and s.lane in ("long", "chat")
        assert 0 < s.ttft_s <= s.e2e_s
        assert 1 <= s.output_tokens <= (DOC_MAX_TOKENS if s.user == "doc" else CHAT_MAX_TOKENS)
        assert len(s.itl_s) == s.output_tokens - 1
    # Documents are classed long by the server, their follow-ups (cached) short.
    assert {s.traffic_class for s in recorded if s.intent == "long"} == {"long"}
