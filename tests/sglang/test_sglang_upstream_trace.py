"""The plugin off, the pass trace on: upstream's own decisions, recorded in the pass-trace form and unchanged."""

from harness.sglang_classes import (
    UPSTREAM_ADDER_CLASS,
    UPSTREAM_PREFILL_RAW,
    EngineSpec,
    Harness,
    ReqSpec,
    StandInScheduler,
)
from scheduler.pass_trace import read_pass_trace
from scheduler.sglang_plugin import upstream_trace


class UpstreamTracedStandInScheduler(StandInScheduler):
    """The stand-in as a server with the plugin off and its trace on patches it (`hooks.UPSTREAM_TRACE_TARGETS`)."""

    def _get_new_batch_prefill_raw(self, *args, **kwargs):
        return upstream_trace.around_get_new_batch_prefill_raw(UPSTREAM_PREFILL_RAW, self, *args, **kwargs)

    def get_prefill_adder_class(self):
        return upstream_trace.around_get_prefill_adder_class(UPSTREAM_ADDER_CLASS, self)


REQS = [
    ReqSpec("holder", 1500, max_new_tokens=8, decode_passes=6),
    ReqSpec("doc", 2700, max_new_tokens=8, arrive_pass=1),
    ReqSpec("q1", 30, max_new_tokens=8, arrive_pass=1),
    ReqSpec("q2", 40, max_new_tokens=8, arrive_pass=4),
]
"""The document does not fit beside the holder: upstream's scan stops at it (FCFS) until the holder leaves."""
ENGINE = EngineSpec(pool_tokens=4096, chunk_tokens=512, max_running=3)


def test_the_trace_records_what_upstream_decided_and_changes_nothing(monkeypatch, tmp_path):
    path = tmp_path / "passes.jsonl"
    monkeypatch.setenv("FAIRSHARE_PASS_TRACE", str(path))
    traced = Harness(ENGINE, REQS, patched=False, scheduler_cls=UpstreamTracedStandInScheduler)
    upstream = Harness(ENGINE, REQS, patched=False)
    assert traced.run(16) == upstream.run(16)
    records = read_pass_trace(path)
    built = [p for p in upstream.history if p.admitted]
    assert [r["admitted"] for r in records if r["admitted"]] == [[list(a) for a in p.admitted] for p in built]
    for record in records:
        cut = [g[0] for g in record["grants"] if g[2]]
        after = upstream.history[record["forward_pass"]]
        assert cut == ([after.chunked] if after.chunked in [a[0] for a in record["admitted"]] else [])
        from_queue = {a[0] for a in record["admitted"]} - {c[0] for c in record["continuing"]}
        assert record["num_waiting"] - len(from_queue) == len(after.waiting)
    # The scan stopped at the document (KV) while the holder ran: one rejection, not skipped, nobody admitted past it.
    stopped = [r for r in records if r["rejections"]]
    assert stopped and all([x[0] for x in r["rejections"]] == ["doc"] and not r["rejections"][0][3] for r in stopped)
    assert all({a[0] for a in r["admitted"]} <= {c[0] for c in r["continuing"]} for r in stopped)
    assert {rid: r["forward_pass"] for r in records for rid in r["arrived"]} == {
        "holder": 0,
        "doc": 1,
        "q1": 1,
        "q2": min(r["forward_pass"] for r in records if r["forward_pass"] >= 4),
    }


def test_the_decoding_rows_recorded_are_those_that_ride_along(monkeypatch, tmp_path):
    path = tmp_path / "passes.jsonl"
    monkeypatch.setenv("FAIRSHARE_PASS_TRACE", str(path))
    reqs = [ReqSpec("q", 30, decode_passes=8), ReqSpec("doc", 1200, arrive_pass=1)]
    traced = Harness(EngineSpec(mixed_chunk=True), reqs, patched=False, scheduler_cls=UpstreamTracedStandInScheduler)
    traced.run(4)
    doc_passes = [r for r in read_pass_trace(path) if r["admitted"] and r["admitted"][0][0] == "doc"]
    assert [r["decode_rows"] for r in doc_passes] == [1] * len(doc_passes) and len(doc_passes) >= 2
    assert [r["admitted"][0][1] for r in doc_passes][:2] == [511, 511]  # the row took a token of each chunk
