"""The CPU a load test's processes use, by role: the engines, the front before them, the load generator, and the
rest of the machine (Ray's dashboard, its agent and log monitor, idle workers, the benchmark itself, the kernel).

On a machine whose cores the engines share with the front and the load generator (the peer benchmark on two
CPU cores), how much of the CPU each role took says whether the engines were short of it or short of work. A
sampler thread reads every process's CPU time (`psutil`) every `period_s` while the load runs; a process counts
from its first sample (or from zero, if it started after the first) to its last, so one that exits during the
load (the load generator at its end) still counts.

It also reads how long each role's threads were ready to run but waited for a core (Linux's run-queue wait,
``/proc/PID/task/TID/schedstat``; absent elsewhere): the engines' wait is the share of the cores the other
processes took from them while they had work. The rest of the machine is read for its CPU only: its threads are
many, and what it waited for says nothing of the roles measured.
"""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROLES: list[tuple[str, re.Pattern[str]]] = [
    # sglang's scheduler and detokenizer processes, a stock server's main process (its tokenizer), this app's
    # engine replicas (which hold the tokenizer and start sglang's processes).
    ("engines", re.compile(r"sglang::scheduler|sglang::detokenizer|sglang\.launch_server|ServeReplica:[^:]+:Engine")),
    ("front", re.compile(r"sglang_router|sglang::router|ServeReplica|ProxyActor|ServeController|raylet|gcs_server")),
    ("load generator", re.compile(r"locust")),
]
REST = "rest of the machine"
"""Every process no role of the table claims."""


def role_of(cmdline: str, roles: list[tuple[str, re.Pattern[str]]] = ROLES) -> str:
    """The role of a process by its command line (or title), the first of `roles` that matches; `REST`: none."""
    return next((role for role, pattern in roles if pattern.search(cmdline)), REST)


def run_queue_wait_s(pid: int, proc_root: Path = Path("/proc")) -> float | None:
    """Seconds the threads of process `pid` have spent ready to run, waiting for a core (the second field of each
    thread's ``schedstat``); None where the kernel does not say (not Linux, no schedstats, the process gone, or
    every thread at zero: a kernel that keeps no figures)."""
    return _schedstat_s(pid, 1, proc_root)


def on_cpu_s(pid: int, proc_root: Path = Path("/proc")) -> float | None:
    """Seconds the threads of process `pid` have run, to the nanosecond (the first field of each thread's
    ``schedstat``; the clock-tick counts of ``/proc/PID/stat`` are 10 ms steps); None as for `run_queue_wait_s`."""
    return _schedstat_s(pid, 0, proc_root)


def _schedstat_s(pid: int, index: int, proc_root: Path) -> float | None:
    total, ran = 0, 0
    for stat in (proc_root / str(pid) / "task").glob("*/schedstat"):
        try:
            fields = [int(f) for f in stat.read_text().split()[:3]]
            total, ran = total + fields[index], ran + fields[0]
        except (OSError, IndexError, ValueError):
            continue
    # A kernel built with the file but not keeping its figures (before 5.14, without schedstats or delay
    # accounting) writes "0 0 0" for every thread: a process that has run no nanosecond says nothing.
    return total / 1e9 if ran else None


@dataclass
class CpuSampler:
    """Cores used by each role between `start` and `stop` (`cores`); `table`: the roles, `ROLES` unless given;
    `rest`: whether the processes no role claims count too, as `REST`."""

    period_s: float = 1.0
    table: list[tuple[str, re.Pattern[str]]] = field(default_factory=lambda: ROLES)
    rest: bool = True
    first: dict[int, float] = field(default_factory=dict)
    last: dict[int, float] = field(default_factory=dict)
    first_wait: dict[int, float] = field(default_factory=dict)
    last_wait: dict[int, float] = field(default_factory=dict)
    roles: dict[int, str] = field(default_factory=dict)
    started_s: float = 0.0
    elapsed_s: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self, initial: bool = False) -> None:
        for proc in psutil.process_iter(["pid", "name", "cmdline"]):
            try:
                role = role_of(" ".join(proc.info["cmdline"] or [proc.info["name"] or ""]), self.table)
                if role == REST and not self.rest:
                    continue
                times = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            pid, used = proc.info["pid"], times.user + times.system
            # A process shows no command line before its exec (its parent's, then) and as a zombie (none): a role
            # once read from its own stays, or a load generator's CPU goes to the rest at its exit.
            self.roles[pid] = self.roles.get(pid, REST) if role == REST else role
            self.first.setdefault(pid, used if initial else 0.0)
            self.last[pid] = used
            if role == REST:
                continue
            waited = run_queue_wait_s(pid)
            if waited is not None:
                self.first_wait.setdefault(pid, waited if initial else 0.0)
                self.last_wait[pid] = waited

    def start(self) -> None:
        self.started_s = time.monotonic()
        self.sample(initial=True)
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        self.elapsed_s = time.monotonic() - self.started_s
        return self.cores()

    def cores(self) -> dict[str, float]:
        """Cores each role used on average over the sampled time (every role of `table`, and `REST` if counted; 0
        where none ran)."""
        return self._per_role(self.first, self.last, [*self._roles, REST] if self.rest else self._roles)

    def waiting_cores(self) -> dict[str, float]:
        """Cores-worth of each role's threads waiting for a core, on average over the sampled time: 0.3 is three
        tenths of a second a second; the roles of `table` only. Empty where the kernel reports no run-queue wait."""
        return self._per_role(self.first_wait, self.last_wait, self._roles) if self.last_wait else {}

    @property
    def _roles(self) -> list[str]:
        return [role for role, _ in self.table]

    def _per_role(self, first: dict[int, float], last: dict[int, float], roles: list[str]) -> dict[str, float]:
        total: dict[str, float] = defaultdict(float)
        for pid, end in last.items():
            total[self.roles[pid]] += max(0.0, end - first[pid])
        span = self.elapsed_s or (time.monotonic() - self.started_s)
        return {role: total[role] / span if span > 0 else 0.0 for role in roles}
