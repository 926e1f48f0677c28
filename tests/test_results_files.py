"""Benchmark result files (`harness.results`): what each holds, the newest as `latest.md`, the index."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from harness.results import (
    LATEST_NAME,
    TABLE_HEADER,
    command_line,
    cores,
    git_commit,
    latest,
    recording,
    runs,
    write_result,
)

REPO = Path(__file__).resolve().parents[1]


def test_a_recorded_run_keeps_what_it_printed_and_what_it_added(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAIRSHARE_RESULTS_DIR", str(tmp_path))
    with recording("demo", "A demo", argv=[str(REPO / "benchmarks" / "overload.py"), "--preset", "h100-8b"]) as run:
        print("figure 1.00")
        run.add_markdown("| a |\n| - |\n| 2 |")
    text = (tmp_path / "demo" / LATEST_NAME).read_text()
    assert text.startswith("# A demo\n")
    assert "- command: `python -m benchmarks.overload --preset h100-8b`" in text
    assert re.search(r"- commit: `[0-9a-f]{7,}(-dirty)?`", text)
    assert re.search(r"- load average \(1/5/15 min\): [\d.]+ / [\d.]+ / [\d.]+ at start", text)
    assert "```text\nfigure 1.00\n```" in text and text.rstrip().endswith("| 2 |")
    assert "figure 1.00" in capsys.readouterr().out  # still printed


def test_a_run_that_fails_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("FAIRSHARE_RESULTS_DIR", str(tmp_path))
    with pytest.raises(RuntimeError), recording("demo", "A demo"):
        print("half")
        raise RuntimeError("benchmark failed")
    assert not (tmp_path / "demo").exists()


def test_latest_is_the_newest_run_and_the_index_links_it(tmp_path):
    first = write_result("bench", "First", "one", argv=["x"], results_dir=tmp_path)
    second = tmp_path / "bench" / "2999-01-01T000000Z-abc1234.md"  # a later start time sorts last
    second.write_text("# Later\n")
    assert runs("bench", tmp_path) == [first, second] and latest("bench", tmp_path) == second
    write_result("other", "Other", "two", argv=["x"], results_dir=tmp_path)
    index = (tmp_path / "README.md").read_text()
    assert f"[{second.name}](bench/{LATEST_NAME})" in index and "| `other` |" in index


def test_the_index_keeps_its_prose_and_rewrites_its_table(tmp_path):
    write_result("bench", "First", "one", argv=["x"], results_dir=tmp_path)
    index = tmp_path / "README.md"
    prose = "# Results\n\nHow a file is written, by hand.\n\n"
    index.write_text(prose + index.read_text()[index.read_text().index(TABLE_HEADER) :])
    write_result("other", "Second", "two", argv=["y"], results_dir=tmp_path)
    text = index.read_text()
    assert text.startswith(prose + TABLE_HEADER)
    assert "| `bench` |" in text and "| `other` |" in text


def test_module_commands_are_written_as_run_from_the_repository_root():
    assert (
        command_line([str(REPO / "scheduler" / "sim" / "__main__.py"), "reproduce"])
        == "python -m scheduler.sim reproduce"
    )
    assert command_line([str(REPO / "benchmarks" / "overload.py"), "a b"]) == "python -m benchmarks.overload 'a b'"
    assert command_line(["locust", "-f", "x"]) == "locust -f x"


def test_every_published_latest_is_its_folders_newest_run():
    results = REPO / "docs" / "results"
    for folder in (p for p in results.iterdir() if p.is_dir()) if results.is_dir() else ():
        newest = latest(folder.name, results)
        assert newest is not None, f"{folder} has no result file"
        assert (folder / LATEST_NAME).read_text() == newest.read_text(), f"{folder}/latest.md is not {newest.name}"


def test_only_changes_outside_docs_make_a_run_dirty(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("a\n")
    (tmp_path / "code.py").write_text("a = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    clean = git_commit(tmp_path)
    (tmp_path / "docs" / "index.md").write_text("b\n")  # what a benchmark writes
    assert git_commit(tmp_path) == clean
    (tmp_path / "code.py").write_text("a = 2\n")
    assert git_commit(tmp_path) == f"{clean}-dirty"


def test_a_run_limited_to_fewer_cores_than_the_machine_says_so(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert cores() == "2 cores"
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    assert cores() == "2 cores, 1 usable (the run's CPU affinity)"
