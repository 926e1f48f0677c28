"""The simulated engine: conservation of KV and tokens, aborts, determinism, workload files."""

import pytest

from scheduler.config import PolicyConfig
from scheduler.interleave import PassKind
from scheduler.sim.engine import SimEngine
from scheduler.sim.experiments import run_spec
from scheduler.sim.presets import CARD12GB, H100_8B
from scheduler.sim.request import Phase, SimRequest
from scheduler.sim.rules import make_scheduler
from scheduler.sim.runner import run
from scheduler.sim.schedulers import PolicyScheduler
from scheduler.sim.workload import load_workload, mixed_poisson
from scheduler.traffic import TrafficClass
from tests.factories import FCFS


@pytest.mark.parametrize("policy", ["baseline", "article-patch", "article-prepatch", "vllm", "fairshare"])
def test_every_request_finishes_with_all_its_tokens_and_no_kv_leaks(policy):
    wl = mixed_poisson(chat_rate_per_s=2.0, doc_rate_per_s=0.05, duration_s=60, seed=3)
    result = run_spec(wl, policy, H100_8B)
    for r in result.requests:
        assert r.phase is Phase.FINISHED, r.rid
        assert r.num_generated == r.output_tokens == len(r.token_times_s)
        assert r.num_prefilled == r.prompt_tokens
        assert r.first_token_s >= r.arrival_s
        assert r.kv_held_tokens == 0
    assert all(a <= b for a, b in zip(result.steps, result.steps[1:], strict=False) for a, b in [(a.end_s, b.start_s)])


def test_runs_are_deterministic():
    wl = mixed_poisson(duration_s=60, seed=11)
    a, b = (run_spec(wl, "fairshare", CARD12GB) for _ in range(2))
    assert [(r.rid, r.first_token_s, r.finish_s) for r in a.requests] == [
        (r.rid, r.first_token_s, r.finish_s) for r in b.requests
    ]


def test_abort_frees_queue_slot_and_kv():
    engine = SimEngine(CARD12GB.cost, make_scheduler("fairshare", CARD12GB))
    engine.add(SimRequest("doc", 100_000, 16, 0.0, TrafficClass.LONG))
    engine.add(SimRequest("q", 30, 16, 0.0))
    engine.step(0.0)
    assert engine.kv_used_tokens > 0
    assert engine.abort("doc") and engine.abort("q")
    assert engine.kv_used_tokens == 0 and engine.idle
    assert not engine.abort("doc")


def test_a_request_larger_than_the_kv_pool_is_refused_clearly():
    engine = SimEngine(CARD12GB.cost, make_scheduler("fairshare", CARD12GB))
    with pytest.raises(ValueError, match="needs 300016 KV tokens, the pool holds 262144"):
        engine.add(SimRequest("huge", 300_000, 16, 0.0))


def test_sglang_default_stalls_decodes_during_prefill_and_mixed_does_not():
    wl = load_workload_from_text("""
name: stall
groups:
  - {name: chat, count: 4, prompt_tokens: 100, output_tokens: 200}
  - {name: doc, traffic_class: long, count: 1, prompt_tokens: 60000, output_tokens: 8, arrival_s: 1.0}
""")
    stalled = {
        p: sum(r.decode_passes_stalled for r in run_spec(wl, p, CARD12GB).requests) for p in ("baseline", "fairshare")
    }
    assert stalled["baseline"] > 0 and stalled["fairshare"] == 0


def load_workload_from_text(text, tmp=None):
    import tempfile
    from pathlib import Path

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    return load_workload(Path(f.name))


def test_workload_file_groups_arrivals_sessions_and_distributions():
    wl = load_workload_from_text("""
name: file
seed: 5
groups:
  - {name: d, traffic_class: long, count: 3, prompt_tokens: {dist: uniform, low: 1000, high: 2000},
     output_tokens: 4, arrival_s: 2.0, interval_s: 1.5, session: "s{i}"}
  - {name: c, count: 5, prompt_tokens: 20, rate_per_s: 2.0}
""")
    reqs = wl.requests()
    docs = [r for r in reqs if r.rid.startswith("d-")]
    assert [r.arrival_s for r in docs] == [2.0, 3.5, 5.0]
    assert [r.session for r in docs] == ["s0", "s1", "s2"]
    assert all(1000 <= r.prompt_tokens <= 2000 and r.traffic_class is TrafficClass.LONG for r in docs)
    assert len(reqs) == 8 and reqs == sorted(reqs, key=lambda r: r.arrival_s)
    result = run(reqs, CARD12GB, make_scheduler("fairshare", CARD12GB))
    assert all(r.phase is Phase.FINISHED for r in result.requests)


def test_bad_workload_file_names_the_problem():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="interval_s or rate_per_s"):
        load_workload_from_text(
            "name: x\ngroups:\n  - {name: g, count: 1, prompt_tokens: 5, interval_s: 1, rate_per_s: 1}\n"
        )


def test_decode_steps_per_prefill_runs_decode_only_passes_after_each_prefill_pass():
    wl = load_workload_from_text("""
name: interval
groups:
  - {name: chat, count: 2, prompt_tokens: 100, output_tokens: 50}
  - {name: doc, traffic_class: long, count: 1, prompt_tokens: 20000, output_tokens: 4, arrival_s: 0.5}
""")
    kinds = [s.kind.value for s in run_spec(wl, "baseline:decode_steps_per_prefill=2", CARD12GB).steps]
    first_doc_pass = kinds.index("prefill", 1)
    # Each prefill pass of the document is followed by two decode-only passes of the chats.
    assert kinds[first_doc_pass : first_doc_pass + 6] == ["prefill", "decode", "decode"] * 2
    plain = [s.kind.value for s in run_spec(wl, "baseline", CARD12GB).steps]
    assert plain[first_doc_pass : first_doc_pass + 3] == ["prefill"] * 3


def overlap_engine(overlap: bool, mixed: bool = False, slots: int = 2) -> SimEngine:
    """A small sglang-like engine (the fairshare policy off: upstream's FCFS rules) with or without the overlap
    scheduler."""
    cfg = PolicyConfig(
        chunk_budget_tokens=256,
        interactive_pass_tokens=256,
        max_running_requests=slots,
        mixed_decode=mixed,
        short_decode_interleave=False,
        **FCFS,
    )
    return SimEngine(CARD12GB.cost, PolicyScheduler(cfg, overlap_schedule=overlap))


def admitted_at(engine: SimEngine, rid: str, max_passes: int = 50) -> int:
    """The forward pass that admits `rid`."""
    for _ in range(max_passes):
        before = engine.num_passes
        waiting = {r.rid for r in engine.waiting}
        engine.step(0.0)
        if rid in waiting and rid not in {r.rid for r in engine.waiting}:
            return before
    raise AssertionError(f"{rid} was not admitted in {max_passes} passes")


@pytest.mark.parametrize("overlap", [False, True])
def test_a_finishing_request_frees_its_slot_one_pass_later_under_the_overlap_scheduler(overlap):
    engine = overlap_engine(overlap)
    engine.add(SimRequest("long", 30, 40, 0.0))  # keeps decoding: no pass is empty
    engine.add(SimRequest("q1", 30, 2, 0.0))  # first token in pass 0, last in pass 1
    engine.add(SimRequest("q2", 30, 2, 0.0))  # waits for q1's slot
    # sglang plans pass 2 before it processes pass 1's results: q1 still holds its slot then.
    assert admitted_at(engine, "q2") == (3 if overlap else 2)


def test_a_finishing_request_holds_its_kv_and_decodes_no_more():
    engine = overlap_engine(True)
    engine.add(SimRequest("long", 30, 40, 0.0))
    engine.add(SimRequest("q1", 30, 2, 0.0))
    engine.step(0.0)
    engine.step(0.0)  # q1's last token
    (q1,) = engine.finishing
    assert q1.phase is Phase.FINISHED and q1.kv_held_tokens == 32 and q1 in engine.running
    result = engine.step(0.0)
    assert result.num_decode_rows == 1 and q1.num_generated == 2  # only `long` decoded
    assert not engine.finishing and q1 not in engine.running and q1.kv_held_tokens == 0


def test_a_finishing_row_takes_a_token_of_a_mixed_chunk():
    """sglang's mixed chunk starts from the chunk less every row of the running batch, finishing ones included
    (`PrefillAdder(num_mixed_decode_tokens=running_bs)`), and then leaves the finishing rows out."""
    engine = overlap_engine(True, mixed=True, slots=3)
    engine.add(SimRequest("q1", 30, 2, 0.0))
    engine.add(SimRequest("q2", 30, 5, 0.0))
    engine.step(0.0)  # both prefilled
    engine.add(SimRequest("doc", 2000, 2, 0.0))
    engine.step(0.0)  # doc's first chunk: q1 and q2 ride along, q1's last token
    doc = next(r for r in engine.running if r.rid == "doc")
    assert doc.num_prefilled == 256 - 2
    result = engine.step(0.0)
    assert result.num_decode_rows == 1  # q2 only
    assert doc.num_prefilled == 2 * (256 - 2)


def test_an_engine_with_only_finishing_requests_releases_them_in_an_iteration_without_a_pass():
    engine = overlap_engine(True)
    engine.add(SimRequest("q", 30, 1, 0.0))
    engine.step(0.0)
    assert engine.finishing and engine.drained and not engine.idle
    result = engine.step(1.0)
    assert result.kind is PassKind.IDLE and result.duration_s == 0.0
    assert engine.idle and engine.kv_used_tokens == 0 and engine.num_passes == 2


def test_aborting_a_finishing_request_releases_it_as_finished():
    engine = overlap_engine(True)
    engine.add(SimRequest("long", 30, 40, 0.0))
    engine.add(SimRequest("q", 30, 1, 0.0))
    engine.step(0.0)
    assert not engine.abort("q")  # it was done already
    assert not engine.finishing and engine.kv_used_tokens == 70
