"""The plugin is found through `importlib.metadata` entry points and `load_plugins()` patches every target
(checked in a fresh process: patching sglang's classes must not leak into the pytest one)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # loads the plugin in a fresh Python process (sglang and Ray imports)

HERE = Path(__file__).parent


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("FAIRSHARE_", "SGLANG_PLUGINS"))}
    return {**env, **extra}


def test_entry_point_is_listed():
    """The acceptance command, verbatim."""
    code = "from importlib.metadata import entry_points; print(entry_points(group='sglang.srt.plugins'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=clean_env())
    assert "name='fairshare', value='scheduler.sglang_plugin:load', group='sglang.srt.plugins'" in out.stdout


@pytest.fixture(scope="module")
def loaded():
    proc = subprocess.run(
        [sys.executable, str(HERE / "plugin_load_check.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(FAIRSHARE_MIXED_DECODE="true"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_discovered_and_every_target_patched(loaded):
    result, log = loaded
    assert ["fairshare", "scheduler.sglang_plugin:load"] in result["entry_points"]
    assert result["setup_hook_error"] is None  # Ray's own loader ran `setup_ray_worker`
    assert result["patched"] == result["targets"]
    assert all(result["wrapped"].values())
    assert "Executed general plugin: fairshare" in log


def test_server_args_hook_maps_the_policy_env(loaded):
    result, _ = loaded
    assert result["enable_mixed_chunk"] is True


def test_patched_scheduler_admits_past_a_capacity_rejection(loaded):
    result, log = loaded
    assert result["policy_active"]
    assert result["admitted"] == [["holder"], ["small"], []]
    assert "long_prefill_token_threshold=" in log


def test_disabled_plugin_says_which_value_turned_it_off():
    """Any false spelling turns the plugin off; the log line names the value given, and nothing is patched."""
    code = (
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        "from scheduler.sglang_plugin import loading\n"
        "from harness.sglang_classes import sglang_is_unpatched\n"
        "loading.load(); print(sglang_is_unpatched())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(FAIRSHARE_PLUGIN_ENABLED="false"),
        cwd=HERE.parents[1],
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "plugin disabled by FAIRSHARE_PLUGIN_ENABLED=false" in out.stderr
    assert out.stdout.strip().splitlines()[-1] == "True"
