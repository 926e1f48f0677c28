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

Each process is also told apart by kind (`KINDS`: sglang's schedulers, this app's engine replicas, Serve's
controller, HAProxy, Ray's agents, ...), finer than its role, so that a result can say which processes a role's
cores went to.
"""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REST = "rest of the machine"
"""Every process no role of the table claims."""

KINDS: list[tuple[str, str, str]] = [
    # (kind of process, its role, its command line's pattern); a process is the first kind it matches, and a kind's
    # role is what `ROLES` counts it as. The engines: sglang's scheduler and detokenizer processes, a stock server's
    # main process (its HTTP server and tokenizer), this app's engine replicas (which hold the tokenizer and start
    # sglang's processes).
    ("sglang schedulers", "engines", r"sglang::scheduler"),
    ("sglang detokenizers", "engines", r"sglang::detokenizer"),
    ("sglang servers (HTTP, tokenizer)", "engines", r"sglang\.launch_server"),
    ("engine replicas", "engines", r"ServeReplica:[^:]+:Engine"),
    ("sglang-router", "front", r"sglang_router|sglang::router"),
    ("other replicas (the ingress)", "front", r"ServeReplica"),
    ("Serve's proxy actor", "front", r"ProxyActor"),
    ("Serve's controller", "front", r"ServeController"),
    ("raylet", "front", r"raylet"),
    ("GCS", "front", r"gcs_server"),
    ("Locust", "load generator", r"locust"),
    ("HAProxy and its manager", REST, r"haproxy|HAProxyManager"),
    ("Ray's agents, dashboard and log monitor", REST, r"DashboardAgent|dashboard|log_monitor|runtime_env|monitor\.py"),
    ("Ray's idle workers", REST, r"ray::IDLE"),
]
OTHER = "other processes"
"""The kind of every process `KINDS` does not name."""

ROLES: list[tuple[str, re.Pattern[str]]] = [
    (role, re.compile("|".join(pattern for _, r, pattern in KINDS if r == role)))
    for role in dict.fromkeys(r for _, r, _ in KINDS)
    if role != REST
]
"""The roles, each the kinds of process it counts (`KINDS`)."""
_KIND_PATTERNS = [(kind, re.compile(pattern)) for kind, _, pattern in KINDS]


def role_of(cmdline: str, roles: list[tuple[str, re.Pattern[str]]] = ROLES) -> str:
    """The role of a process by its command line (or title), the first of `roles` that matches; `REST`: none."""
    return next((role for role, pattern in roles if pattern.search(cmdline)), REST)


def kind_of(cmdline: str) -> str:
    """The kind of a process by its command line (or title): the first of `KINDS` it matches; `OTHER`: none."""
    return next((kind for kind, pattern in _KIND_PATTERNS if pattern.search(cmdline)), OTHER)


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
    kinds: dict[int, str] = field(default_factory=dict)
    started_s: float = 0.0
    elapsed_s: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self, initial: bool = False) -> None:
        for proc in psutil.process_iter(["pid", "name", "cmdline"]):
            try:
                cmdline = " ".join(proc.info["cmdline"] or [proc.info["name"] or ""])
                role, kind = role_of(cmdline, self.table), kind_of(cmdline)
                if role == REST and not self.rest:
                    continue
                times = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            pid, used = proc.info["pid"], times.user + times.system
            # A process shows no command line before its exec (its parent's, then) and as a zombie (none): a role
            # once read from its own stays, or a load generator's CPU goes to the rest at its exit.
            self.roles[pid] = self.roles.get(pid, REST) if role == REST else role
            self.kinds[pid] = self.kinds.get(pid, OTHER) if kind == OTHER else kind
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
        return self._per(self.roles, self.first, self.last, [*self._roles, REST] if self.rest else self._roles)

    def cores_by_kind(self) -> dict[str, float]:
        """Cores each kind of process used on average over the sampled time (every kind of `KINDS` and `OTHER`, 0
        where none ran; the processes the role table leaves out, if `rest` is false, are not counted)."""
        return self._per(self.kinds, self.first, self.last, [*(k for k, _, _ in KINDS), OTHER])

    def waiting_cores(self) -> dict[str, float]:
        """Cores-worth of each role's threads waiting for a core, on average over the sampled time: 0.3 is three
        tenths of a second a second; the roles of `table` only. Empty where the kernel reports no run-queue wait."""
        return self._per(self.roles, self.first_wait, self.last_wait, self._roles) if self.last_wait else {}

    def waiting_cores_by_kind(self) -> dict[str, float]:
        """`waiting_cores` by kind of process: the kinds some process of a `table` role was, the rest of the machine's
        left out (its wait is not read). Empty where the kernel reports no run-queue wait."""
        kinds = dict.fromkeys(self.kinds.get(pid, OTHER) for pid in self.last_wait)
        return self._per(self.kinds, self.first_wait, self.last_wait, list(kinds)) if self.last_wait else {}

    @property
    def _roles(self) -> list[str]:
        return [role for role, _ in self.table]

    def _per(
        self, group: dict[int, str], first: dict[int, float], last: dict[int, float], names: list[str]
    ) -> dict[str, float]:
        total: dict[str, float] = defaultdict(float)
        for pid, end in last.items():
            # A sampled process has a role and a kind; a sampler given its roles alone counts the kinds as OTHER.
            total[group.get(pid, OTHER)] += max(0.0, end - first[pid])
        span = self.elapsed_s or (time.monotonic() - self.started_s)
        return {name: total[name] / span if span > 0 else 0.0 for name in names}
