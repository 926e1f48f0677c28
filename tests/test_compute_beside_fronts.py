"""`benchmarks.compute_beside_fronts`: the probe process, its count of the rest of the machine, the table, the CLI."""

from __future__ import annotations

import os

import pytest

from benchmarks.compute_beside_fronts import BUSY, NOTHING, Round, busy_loop, main, run_probe, table
from loadtests import peers


def test_the_probe_times_passes_in_its_own_process():
    got = run_probe(0.5)
    assert got.passes_s and all(p > 0 for p in got.passes_s)
    assert got.other_cores >= 0


def test_a_busy_neighbour_shows_as_the_rest_of_the_machines_cpu():
    # An accounting check, not a timing one: a process spinning beside the probe is CPU the probe did not use.
    with busy_loop():
        got = run_probe(1.0)
    assert got.other_cores > 0.1


def test_the_table_gives_each_row_its_median_and_ratio_to_nothing():
    rows = {
        NOTHING: [Round([0.010, 0.011, 0.012], 0.02), Round([0.010], 0.04)],
        BUSY: [Round([0.020, 0.022, 0.024], 0.9)],
    }
    lines = table(rows).splitlines()
    assert lines[2] == "| nothing | 10.5 ms | 1.00x | 0.03 |"
    assert lines[3] == f"| {BUSY} | 22.0 ms | 2.10x | 0.90 |"


def test_an_unknown_front_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAIRSHARE_RESULTS_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as ended:
        main(["--fronts", "fairshare,vllm"])
    assert ended.value.code == 2
    assert "unknown front 'vllm'" in capsys.readouterr().err


def test_every_front_the_peers_name_can_be_started_from_the_one_map(tmp_path, monkeypatch):
    for var in ("PYTHONPATH", "OMP_NUM_THREADS"):  # `app_front` exports them: restored after the test
        monkeypatch.setenv(var, os.environ.get(var, ""))
    starters = peers.front_starters(tmp_path / "model", peers.EngineSettings(), tmp_path)
    assert sorted(starters) == sorted(peers.FRONTS)
