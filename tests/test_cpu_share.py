"""CPU by role in a load test (`loadtests.cpu_share`): processes told apart by command line, and a process that
exits during the load still counted."""

from __future__ import annotations

import subprocess
import sys

from loadtests.cpu_share import CpuSampler, role_of


def test_processes_are_told_apart_by_their_command_lines():
    assert role_of("sglang::scheduler_TP0") == "engines"
    assert role_of("ray::ServeReplica:fairshare:Engine") == "engines"
    assert role_of("python -m sglang.launch_server --model-path /m") == "engines"
    assert role_of("ray::ServeReplica:fairshare:Ingress") == "front"
    assert role_of("ray::ProxyActor") == "front"
    assert role_of("python -m sglang_router.launch_router --policy cache_aware") == "front"
    assert role_of("python -m locust -f loadtests/locustfile.py --headless") == "load generator"
    assert role_of("python -m pytest") is None


def test_a_process_that_exits_during_the_load_is_counted():
    sampler = CpuSampler(period_s=0.05)
    sampler.start()
    # A "load generator" that burns half a CPU second, however loaded the machine is, then exits.
    burn = "import time\nwhile time.process_time() < 0.5: pass"
    subprocess.run([sys.executable, "-c", burn, "locust"], check=True)
    cores = sampler.stop()
    assert set(cores) == {"engines", "front", "load generator"}
    used_s = cores["load generator"] * sampler.elapsed_s
    assert 0.3 <= used_s <= 0.5 + 0.5  # up to one sampling period lost at its exit; its start-up on top
