"""The overload fixes inside sglang: short streams keep decoding during a document's prefill with sglang's
default (mixed chunk off), and documents cannot take the running slots kept for short requests."""

from harness.sglang_classes import EngineSpec, Harness, ReqSpec
from scheduler.pass_trace import read_pass_trace


def _prefill_passes_while_decoding(plugin: Harness, rid: str) -> list[bool]:
    """For each pass in which `rid` was decoding: did the pass prefill (True) or decode only (False)?"""
    kinds = []
    for _ in range(14):
        decoding = any(r.rid == rid for r in plugin.running.reqs)
        record = plugin.step()
        if decoding:
            kinds.append(bool(record.admitted))
    return kinds


def test_short_streams_get_a_decode_pass_after_each_prefill_pass_with_mixed_chunk_off():
    reqs = [ReqSpec("q", 200, decode_passes=10), ReqSpec("doc", 6000, arrive_pass=1)]
    plugin = Harness(EngineSpec(pool_tokens=65_536, chunk_tokens=512), reqs)
    assert plugin.policy.cfg.mixed_decode is False  # the stand-in engine resolved sglang's default
    kinds = _prefill_passes_while_decoding(plugin, "q")
    assert kinds[:6] == [True, False, True, False, True, False]  # never two prefill passes in a row
    assert plugin.sched.forward_ct == 14


def test_without_the_interleave_the_document_prefills_every_pass(monkeypatch):
    monkeypatch.setenv("FAIRSHARE_SHORT_DECODE_INTERLEAVE", "false")
    reqs = [ReqSpec("q", 200, decode_passes=10), ReqSpec("doc", 6000, arrive_pass=1)]
    plugin = Harness(EngineSpec(pool_tokens=65_536, chunk_tokens=512), reqs)
    assert all(_prefill_passes_while_decoding(plugin, "q"))


def _slot_scenario() -> tuple[EngineSpec, list[ReqSpec]]:
    engine = EngineSpec(pool_tokens=65_536, chunk_tokens=4096, max_running=8)
    docs = [ReqSpec(f"doc{i}", 300, decode_passes=50) for i in range(8)]
    return engine, [*docs, ReqSpec("q", 30, arrive_pass=1)]


def test_documents_leave_a_running_slot_for_short_requests(monkeypatch):
    monkeypatch.setenv("FAIRSHARE_SHORT_REQUEST_TOKENS", "100")  # 300-token prompts count as long here
    plugin = Harness(*_slot_scenario())
    plugin.run(2)
    assert len(plugin.history[0].admitted) == 7  # one of the eight slots is the reserve
    assert plugin.history[1].admitted == [("q", 30)]  # the question is admitted the pass it arrives


def test_without_the_reserve_documents_take_every_slot(monkeypatch):
    monkeypatch.setenv("FAIRSHARE_SHORT_REQUEST_TOKENS", "100")
    monkeypatch.setenv("FAIRSHARE_INTERACTIVE_RESERVE", "false")
    plugin = Harness(*_slot_scenario())
    plugin.run(2)
    assert len(plugin.history[0].admitted) == 8
    assert plugin.history[1].admitted == []


def test_pass_counters_follow_sglangs_forward_passes_decode_only_ones_included():
    # The simulator counts its steps; the plugin hands the planner sglang's forward_ct: both count every
    # forward pass, so a window of N passes means the same in both (here decode-only passes sit in between).
    reqs = [ReqSpec("q", 200, decode_passes=10), ReqSpec("doc", 6000, arrive_pass=1)]
    plugin = Harness(EngineSpec(pool_tokens=65_536, chunk_tokens=512), reqs)
    planned_at = []
    for _ in range(8):
        before, ct = plugin.policy.last_run, plugin.sched.forward_ct
        plugin.step()
        if plugin.policy.last_run is not before:
            planned_at.append((ct, plugin.policy.last_run.snapshot.pass_index))
    assert [ct for ct, _ in planned_at] == [0, 1, 3, 5, 7]
    assert all(ct == index for ct, index in planned_at)


def test_the_pass_trace_carries_the_forward_pass_the_policy_counted(monkeypatch, tmp_path):
    """The trace numbers planned passes (``pass``) and also gives sglang's forward_ct the policy counted with
    (``forward_pass``): they part as soon as a decode-only pass is interleaved."""
    trace = tmp_path / "passes.jsonl"
    monkeypatch.setenv("FAIRSHARE_PASS_TRACE", str(trace))
    reqs = [ReqSpec("q", 200, decode_passes=10), ReqSpec("doc", 6000, arrive_pass=1)]
    plugin = Harness(EngineSpec(pool_tokens=65_536, chunk_tokens=512), reqs)
    plugin.run(8)
    records = read_pass_trace(trace)
    assert [r["pass"] for r in records] == [0, 1, 2, 3, 4]
    assert [r["forward_pass"] for r in records] == [0, 1, 3, 5, 7]
