"""The simulated engine: conservation of KV and tokens, aborts, determinism, workload files."""

import pytest

from scheduler.sim.engine import SimEngine
from scheduler.sim.experiments import run_spec
from scheduler.sim.presets import CARD12GB, H100_8B
from scheduler.sim.request import Phase, SimRequest
from scheduler.sim.rules import make_scheduler
from scheduler.sim.runner import run
from scheduler.sim.workload import load_workload, mixed_poisson
from scheduler.traffic import TrafficClass


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
