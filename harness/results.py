"""Benchmark result files: every benchmark run writes one, and the docs link them.

A result file holds what is needed to rerun and to judge a figure: the command, the commit (``-dirty`` when the
tree had uncommitted changes), the date, the machine, the load average when the run started and ended, and the
benchmark's own tables. Files go to ``docs/results/<benchmark>/<date>-<commit>.md``, and the newest is also
``docs/results/<benchmark>/latest.md``, which the docs link; ``docs/results/README.md`` indexes them. Figures are
never retyped into prose.

``FAIRSHARE_RESULTS_DIR`` moves the folder: tests that run a benchmark point it at a temporary one.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import io
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ParamSpec, TextIO, TypeVar

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR_ENV = "FAIRSHARE_RESULTS_DIR"
DEFAULT_RESULTS_DIR = REPO / "docs" / "results"
INDEX_NAME = "README.md"
LATEST_NAME = "latest.md"


def results_dir_now() -> Path:
    """Where result files go: ``FAIRSHARE_RESULTS_DIR`` if set, else docs/results."""
    return Path(os.environ.get(RESULTS_DIR_ENV) or DEFAULT_RESULTS_DIR)


def git_commit(repo: Path = REPO) -> str:
    """The short commit hash, with ``-dirty`` when tracked files outside docs/ differ from it (what a benchmark
    writes there, results and plots, says nothing about the code that ran); ``unknown`` outside git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs"],
            cwd=repo,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head


def machine() -> str:
    """Processor model, cores, memory and Python: what makes an absolute figure comparable."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else 0.0
    system = f"{platform.system()} {platform.machine()}, Python {platform.python_version()}"
    return f"{cpu}, {cores()}, {mem_gib:.0f} GiB, {system}"


def cores() -> str:
    """The machine's cores, and how many of them the run may use where its CPU affinity (inherited from whatever
    started it: a shell, a CI runner) allows fewer: a run on one core of two is not the two-core machine's figure."""
    total = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else total
    return f"{total} cores" if usable >= total else f"{total} cores, {usable} usable (the run's CPU affinity)"


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass
class BenchmarkRun:
    """One run of a benchmark: made when it starts (the start load), written when it has its tables."""

    name: str
    """The benchmark's name: its folder under docs/results/."""
    argv: list[str] = field(default_factory=lambda: list(sys.argv))
    started: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    start_load: str = field(default_factory=load_average)
    commit: str = field(default_factory=git_commit)
    """Read when the run starts: the code that ran, even if the tree changes before it ends."""
    start_monotonic_s: float = field(default_factory=time.monotonic)
    sections: list[str] = field(default_factory=list)
    """Markdown the benchmark adds after what it printed (a table, a plot's link)."""

    def add_markdown(self, text: str) -> None:
        self.sections.append(text.rstrip())

    def write(self, title: str, body_markdown: str, results_dir: Path | None = None) -> Path:
        results_dir = results_dir or results_dir_now()
        commit = self.commit
        stamp = self.started.strftime("%Y-%m-%dT%H%M%SZ")
        path = results_dir / self.name / f"{stamp}-{commit}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        header = [
            f"# {title}",
            "",
            f"- command: `{command_line(self.argv)}`",
            f"- commit: `{commit}`",
            f"- date: {self.started:%Y-%m-%d %H:%M:%S} UTC, {time.monotonic() - self.start_monotonic_s:.0f} s",
            f"- machine: {machine()}",
            f"- load average (1/5/15 min): {self.start_load} at start, {load_average()} at end",
            "",
        ]
        text = "\n".join(header) + body_markdown.rstrip() + "\n"
        path.write_text(text)
        (path.parent / LATEST_NAME).write_text(text)
        write_index(results_dir)
        return path


class _Tee(io.TextIOBase):
    """Writes go to the terminal and to a buffer."""

    def __init__(self, out: TextIO, copy: io.StringIO) -> None:
        self.out, self.copy = out, copy

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()

    def isatty(self) -> bool:
        return False


@contextlib.contextmanager
def recording(
    name: str, title: str, results_dir: Path | None = None, argv: list[str] | None = None
) -> Iterator[BenchmarkRun]:
    """Run a benchmark's body with its standard output kept: when the body finishes, the output (as a text block)
    and whatever the body added with `BenchmarkRun.add_markdown` become the run's result file. A body that raises
    writes nothing."""
    run = BenchmarkRun(name) if argv is None else BenchmarkRun(name, argv=argv)
    printed = io.StringIO()
    with contextlib.redirect_stdout(_Tee(sys.stdout, printed)):
        yield run
    body = ["```text\n" + printed.getvalue().strip("\n") + "\n```", *run.sections]
    path = run.write(title, "\n\n".join(body), results_dir)
    print(f"result file: {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")


def command_line(argv: list[str]) -> str:
    """The command as one would type it from the repository root."""
    args = list(argv)
    if not args or not args[0].endswith(".py"):
        return shlex.join(args)
    script = Path(args[0]).resolve()
    where = script.relative_to(REPO) if script.is_relative_to(REPO) else Path(script.name)
    if where.name == "__main__.py":
        return shlex.join(["python", "-m", ".".join(where.parent.parts), *args[1:]])
    if (script.parent / "__init__.py").exists():  # a module of a package: run from the repository root
        return shlex.join(["python", "-m", ".".join(where.with_suffix("").parts), *args[1:]])
    return shlex.join(["python", str(where), *args[1:]])


def write_result(
    name: str, title: str, body_markdown: str, *, argv: list[str] | None = None, results_dir: Path | None = None
) -> Path:
    """Write one result file now (for a benchmark that did not keep a `BenchmarkRun` from its start)."""
    run = BenchmarkRun(name) if argv is None else BenchmarkRun(name, argv=argv)
    return run.write(title, body_markdown, results_dir)


def runs(name: str, results_dir: Path | None = None) -> list[Path]:
    """A benchmark's result files, oldest first (their names start with the UTC start time)."""
    folder = (results_dir or results_dir_now()) / name
    return sorted(p for p in folder.glob("*.md") if p.name != LATEST_NAME)


def latest(name: str, results_dir: Path | None = None) -> Path | None:
    found = runs(name, results_dir or results_dir_now())
    return found[-1] if found else None


TABLE_HEADER = "| benchmark | newest result | what it measures |"
DEFAULT_PREAMBLE = [
    "# Benchmark results",
    "",
    "Written by the benchmarks themselves (`harness/results.py`): one file per run, with its command, commit,",
    "date, machine and load average. The newest of each (also its folder's `latest.md`, which the docs link):",
    "",
]


def write_index(results_dir: Path | None = None) -> Path:
    """``README.md`` of the results folder: its prose as written (everything above the table), then the table of
    the newest result of each benchmark."""
    results_dir = results_dir or results_dir_now()
    index = results_dir / INDEX_NAME
    old = index.read_text().splitlines() if index.exists() else []
    preamble = old[: old.index(TABLE_HEADER)] if TABLE_HEADER in old else DEFAULT_PREAMBLE
    rows = []
    for folder in sorted(p for p in results_dir.iterdir() if p.is_dir()):
        newest = latest(folder.name, results_dir)
        if newest is not None:
            title = newest.read_text().splitlines()[0].removeprefix("# ")
            rows.append(f"| `{folder.name}` | [{newest.name}]({folder.name}/{LATEST_NAME}) | {title} |")
    index.write_text("\n".join([*preamble, TABLE_HEADER, "| --- | --- | --- |", *rows, ""]))
    return index


P = ParamSpec("P")
R = TypeVar("R")


def records(name: str, title: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a benchmark's ``main``: what it prints becomes a result file when it returns (see `recording`)."""

    def wrap(main: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(main)
        def recorded(*args: P.args, **kwargs: P.kwargs) -> R:
            with recording(name, title):
                return main(*args, **kwargs)

        return recorded

    return wrap
