"""The trace-timeline benchmark on a made-up trace: a document's prefill split into its passes, others' and gaps."""

from __future__ import annotations

import json

import pytest

from benchmarks import trace_timeline


def plan(pid: int, i: int, grants: list, sized_by: str) -> dict:
    grants = [[rid, n, False] for rid, n in grants]
    return {"pid": pid, "pass": i, "forward_pass": i, "grants": grants, "sized_by": sized_by}


def timed(pid: int, i: int, end: float, seconds: float) -> dict:
    return {"pid": pid, "timed_pass": i, "at": end, "measured_s": seconds}


def test_a_documents_wall_time_is_its_passes_others_and_the_gaps(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAIRSHARE_RESULTS_DIR", str(tmp_path / "results"))
    lines = [
        plan(1, 0, [("doc", 5000)], "ttft"),
        timed(1, 0, 1.0, 1.0),  # 0.0-1.0
        plan(1, 1, [("chat", 50)], "admit"),
        timed(1, 1, 1.2, 0.1),  # 1.1-1.2, after a 0.1 s gap
        plan(1, 2, [("doc", 5000), ("chat2", 30)], "admit"),
        timed(1, 2, 2.4, 1.0),  # 1.4-2.4, after a 0.2 s gap
        plan(2, 0, [("small", 100)], "ttft"),
        timed(2, 0, 0.5, 0.5),
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(map(json.dumps, lines)) + "\n{broken\n")
    engines = trace_timeline.read(trace)
    assert trace_timeline.documents(engines[1]) == ["doc"] and trace_timeline.documents(engines[2]) == []
    wall, by = trace_timeline.split(engines[1], "doc")
    assert wall == pytest.approx(2.4)
    assert by["its own: ttft"] == 1.0 and by["its own: admit"] == 1.0 and by["other: admit"] == 0.1
    assert by[trace_timeline.GAP] == pytest.approx(0.3)
    assert trace_timeline.gap_quantiles(engines[1]) == pytest.approx([0.2, 0.2, 0.2])
    trace_timeline.main([str(trace)])
    out = capsys.readouterr().out
    assert "1 documents" in out and "gaps (no timed pass) | 0.300 | 12.5%" in out


def test_a_missing_trace_is_named():
    with pytest.raises(SystemExit):
        trace_timeline.main(["/nonexistent/trace.jsonl"])
