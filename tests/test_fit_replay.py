"""The fit-replay benchmark on a made-up trace: every engine's passes replayed in order, each variant judged."""

from __future__ import annotations

import json

import pytest

from benchmarks import fit_replay
from scheduler.pass_cost import chunk_ctx_pairs


def timed(pid: int, tokens: int, depth: int, rows: int, seconds: float) -> str:
    return json.dumps(
        {
            "pid": pid,
            "timed_pass": 1,
            "prefill_tokens": tokens,
            "prefill_ctx_pairs": chunk_ctx_pairs(depth, tokens) if tokens else 0.0,
            "decode_rows": rows,
            "decode_ctx_tokens": 100 * rows,
            "measured_s": seconds,
        }
    )


def test_each_engine_is_replayed_alone_and_its_deep_chunks_listed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAIRSHARE_RESULTS_DIR", str(tmp_path / "results"))
    lines = []
    for pid in (11, 22):
        lines += [timed(pid, 64, 0, 1, 0.01) for _ in range(8)]
        # Chunks ever deeper and slower: attention the first fit has not seen.
        lines += [timed(pid, 2048, 2048 * k, 1, 0.1 * (k + 1)) for k in range(6)]
        lines += [timed(pid, 0, 0, 2, 0.005) for _ in range(4)]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(lines) + "\nnot json\n")
    fit_replay.main([str(trace), "--source", "made up"])
    out = capsys.readouterr().out
    for pid in (11, 22):
        assert all(f"{pid} | {variant} | 6 |" in out for variant in fit_replay.VARIANTS)
        assert f"{pid} pass 13: 2048 tokens" in out
    assert "(made up)" in out and list((tmp_path / "results" / "fit-replay").glob("*.md"))


# The first 14 passes a CPU engine timed in a peers run (figures and seconds as its trace has them): a chat, a few
# decode passes, a document's first 512-token chunks, then chunks of 1,600-2,048 tokens ever deeper.
ENGINE_START = [
    (22, 253.0, 0, 0, 0.0124),
    (0, 0.0, 1, 23, 0.0061),
    (0, 0.0, 1, 22, 0.0043),
    (0, 0.0, 1, 23, 0.0034),
    (512, 133888.0, 0, 0, 0.0194),
    (512, 396032.0, 0, 0, 0.0177),
    (512, 658176.0, 0, 0, 0.0177),
    (512, 920320.0, 0, 0, 0.0224),
    (512, 1182464.0, 0, 0, 0.0277),
    (1787, 6181233.0, 0, 0, 0.1871),
    (1646, 8518873.0, 0, 0, 0.2068),
    (2048, 14382080.0, 0, 0, 0.4035),
    (2048, 17356693.0, 0, 0, 0.473),
    (2046, 21149011.0, 2, 134, 0.5785),
]


def test_the_floor_lifts_the_deep_chunks_a_young_fit_underpredicts():
    keys = ("prefill_tokens", "prefill_ctx_pairs", "decode_rows", "decode_ctx_tokens", "measured_s")
    passes = [dict(zip(keys, p, strict=True)) for p in ENGINE_START]
    built = {i: p for i, _, _, p in fit_replay.replay(passes, fit_replay.VARIANTS["as built"])}
    bare = {i: p for i, _, _, p in fit_replay.replay(passes, fit_replay.VARIANTS["no floor"])}
    held = {i: p for i, _, _, p in fit_replay.replay(passes, fit_replay.VARIANTS["no floor, held"])}
    assert built.keys() == bare.keys() == held.keys() and all(built[i] >= bare[i] for i in built)
    # Held for 8 passes, the first fit predicts the deep chunks far too fast; refitting every pass moves towards them.
    assert held[13] < 0.1 < bare[13]
    # The two deepest chunks: at least the second slowest of the chunks before them (0.207 s, then 0.404 s, the
    # last scaled by its 2,046 tokens against 2,048).
    assert built[12] >= 0.2068 and built[13] >= 0.4035 * 2046 / 2048
    assert bare[13] < 0.4


def test_a_missing_trace_is_named():
    with pytest.raises(SystemExit):
        fit_replay.main(["/nonexistent/trace.jsonl"])
