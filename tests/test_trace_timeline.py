"""The trace-timeline benchmark on a made-up trace: a document's prefill split into its passes, others' and gaps."""

from __future__ import annotations

import json

import pytest

from benchmarks import trace_timeline


def plan(pid: int, i: int, grants: list, sized_by: str, at: float = 0.0) -> dict:
    grants = [[rid, n, False] for rid, n in grants]
    return {"pid": pid, "at": at, "pass": i, "forward_pass": i, "grants": grants, "sized_by": sized_by}


def timed(pid: int, i: int, end: float, seconds: float) -> dict:
    return {"pid": pid, "timed_pass": i, "at": end, "measured_s": seconds}


def test_a_documents_wall_time_is_its_passes_others_and_the_gaps(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAIRSHARE_RESULTS_DIR", str(tmp_path / "results"))
    lines = [
        plan(1, 0, [("doc", 5000)], "ttft", 0.0),
        timed(1, 0, 1.0, 1.0),  # 0.0-1.0
        plan(1, 1, [("chat", 50)], "admit", 1.1),
        timed(1, 1, 1.2, 0.1),  # 1.1-1.2, after a 0.1 s gap
        plan(1, 2, [("doc", 5000), ("chat2", 30)], "admit", 1.4),
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


def test_prefill_rate_by_depth_reads_plans_alone_as_a_stock_engines_trace_has_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAIRSHARE_RESULTS_DIR", str(tmp_path / "results"))
    chunks = [(0.0, [("doc", 3000)]), (1.0, [("doc", 1000), ("chat", 40)]), (1.5, [("doc", 3000)])]
    chunks += [(3.5, [("doc", 3000)]), (6.5, [("chat2", 30)])]
    lines = [plan(7, i, grants, "static", at) for i, (at, grants) in enumerate(chunks)]
    trace = tmp_path / "stock.jsonl"
    trace.write_text("\n".join(map(json.dumps, lines)) + "\n")
    (engine,) = trace_timeline.read(trace).values()
    # The shared pass (doc beside a chat) moves the depth on but is not counted: 3000 tokens at 0, 4000, 7000.
    assert trace_timeline.rate_by_depth(engine) == {
        (0, 2000): (3000, 1.0),
        (2000, 5000): (3000, 2.0),
        (5000, 8000): (3000, 3.0),
    }
    trace_timeline.main([str(trace)])
    out = capsys.readouterr().out
    assert "7 | 2000-5000 | 3000 | 1500" in out and "no timed passes of documents" in out
