"""The comparison of the simulator with real sglang, without sglang: the random mixes, the replay of where each
request arrived, and the pass-by-pass pairing (`harness.sim_vs_sglang`; the real engines run in
tests/sglang_cpu/test_sim_vs_sglang.py and `python -m benchmarks.sim_agreement`)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.pass_agreement import AFTER, KV_BOOKKEEPING, MixComparison, compare, explain
from harness.sim_vs_sglang import LIMITS, SETUPS, VOCAB_WORDS, Arrival, request_prompt, sglang_batches, simulate
from harness.workload_mixes import Mix, MixRequest, random_mix

SEEDS = range(200)


def test_random_mixes_are_reproducible_and_valid():
    assert random_mix(7) == random_mix(7) and random_mix(7) != random_mix(8)
    for seed in SEEDS:
        mix = random_mix(seed)
        assert len({r.rid for r in mix.requests}) == len(mix.requests)
        for r in mix.requests:
            assert r.prompt_tokens + r.output_tokens <= LIMITS.kv_pool_tokens  # each fits the pool alone
        assert [r.batch for r in mix.requests] == sorted(r.batch for r in mix.requests)


def test_random_mixes_press_on_slots_and_kv_and_arrive_in_batches():
    mixes = [random_mix(seed) for seed in SEEDS]
    over_slots = [m for m in mixes if len(m.requests) > LIMITS.max_running_requests]
    over_kv = [m for m in mixes if sum(r.prompt_tokens + r.output_tokens for r in m.requests) > LIMITS.kv_pool_tokens]
    staggered = [m for m in mixes if len(m.after_passes) > 1]
    long_docs = [m for m in mixes if any(r.prompt_tokens > 2048 for r in m.requests)]
    for share in (len(over_slots), len(over_kv), len(staggered), len(long_docs)):
        assert share >= 0.25 * len(mixes)
    outputs = {r.output_tokens for m in mixes for r in m.requests}
    assert min(outputs) == 1 and max(outputs) >= 12


def test_every_request_of_a_run_has_its_own_first_token():
    mixes = [random_mix(seed) for seed in range(40)]
    firsts = [ids[0] for batch in sglang_batches(mixes) for ids in batch["input_ids"]]
    assert len(firsts) == len(set(firsts))
    with pytest.raises(ValueError, match="at most"):
        request_prompt(VOCAB_WORDS, "r", 10)


def test_batches_of_a_mix_form_one_group_sent_in_order():
    mix = Mix("m", (MixRequest("a", 10, 1), MixRequest("b", 10, 1, batch=1), MixRequest("c", 10, 1, batch=1)), (0, 4))
    batches = sglang_batches([mix, mix])
    assert [(b["group"], b["after_passes"], b["rid"]) for b in batches] == [
        (0, 0, ["a"]),
        (0, 4, ["b", "c"]),
        (1, 0, ["a"]),
        (1, 4, ["b", "c"]),
    ]


def staggered_mix() -> Mix:
    doc, q1, q2 = MixRequest("doc", 1500, 2), MixRequest("q1", 30, 3, batch=1), MixRequest("q2", 20, 2, batch=1)
    return Mix("staggered", (doc, q1, q2), (0, 3))


@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.name)
def test_the_simulator_replays_each_arrival_at_the_forward_pass_sglang_saw_it_in(setup):
    mix = staggered_mix()
    arrivals = {"doc": Arrival(40, True, False), "q1": Arrival(43, False), "q2": Arrival(43, False)}
    records = simulate([mix], arrivals, setup, LIMITS.kv_pool_tokens)
    seen = {rid: r["forward_pass"] for r in records for rid in r["arrived"]}
    assert seen == {"doc": 40, "q1": 43, "q2": 43}
    assert records[0]["forward_pass"] == 40  # the mix starts at sglang's forward-pass count


def test_a_batch_that_found_the_last_results_processed_finds_the_finished_request_gone():
    """sglang had processed the pass before when it first saw the batch: the request that finished last has left;
    had it not (its last token still in flight), the request would still hold its slot (overlap scheduler)."""
    first, late = MixRequest("first", 30, 1), MixRequest("late", 30, 1, batch=1)
    mix = Mix("idle-gap", (first, late), (0, 9))
    setup = SETUPS[0]
    busy = simulate([mix], {"first": Arrival(0, True), "late": Arrival(1, False)}, setup, LIMITS.kv_pool_tokens)
    processed = {"first": Arrival(0, True), "late": Arrival(1, True, finishing_seen=False)}
    idle = simulate([mix], processed, setup, LIMITS.kv_pool_tokens)
    assert [r["free_running_slots"] for r in busy if r["arrived"] == ["late"]] == [LIMITS.max_running_requests - 1]
    assert [r["free_running_slots"] for r in idle if r["arrived"] == ["late"]] == [LIMITS.max_running_requests]


@settings(max_examples=20, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), setup=st.sampled_from(SETUPS))
def test_a_trace_agrees_with_itself_and_a_changed_pass_is_reported(seed, setup):
    mix = random_mix(seed)
    arrivals = {r.rid: Arrival(0 if r.batch == 0 else 100, True, False) for r in mix.requests}
    records = simulate([mix], arrivals, setup, LIMITS.kv_pool_tokens)
    same = compare(setup.name, [mix], records, copy.deepcopy(records))
    assert same.num_identical == same.num_passes > 0 and not same.unexplained
    changed = copy.deepcopy(records)
    target = next(r for r in changed if r["admitted"])
    target["admitted"][0][1] += 1
    report = compare(setup.name, [mix], changed, records)
    assert report.num_identical == report.num_passes - 1
    assert [(mix_name, i) for mix_name, i, *_ in report.unexplained] == [(mix.name, 0)]


def record(admitted, judged, free_kv, rejected=(), continuing=(("doc", 500),), num_decoding=1):
    """A prefill pass record with only what the comparison reads."""
    return {
        "admitted": [list(a) for a in admitted],
        "continuing": [list(c) for c in continuing],
        "judged": [list(j) for j in judged],
        "grants": [[rid, tokens, rid == "doc"] for rid, tokens in admitted],
        "rejections": [[rid, need, free_kv, False] for rid, need in rejected],
        "free_kv_tokens": free_kv,
        "num_decoding": num_decoding,
        "num_waiting": len(judged),
        "decode_rows": 0,
    }


@pytest.mark.parametrize(("sim_free_kv", "reason"), [(41, KV_BOOKKEEPING), (40 + 4, KV_BOOKKEEPING), (45, None)])
def test_a_request_that_fits_on_one_side_only_by_a_few_tokens_is_the_kv_bookkeeping(sim_free_kv, reason):
    """The simulator admits the question with `sim_free_kv - 40` tokens to spare; sglang, counting a few tokens more,
    rejects it. Within `kv_window` (3 + one running stream) that is sglang's bookkeeping; beyond, unexplained."""
    sim = record([("doc", 226), ("q", 30)], [("q", 30, 40)], sim_free_kv)
    real = record([("doc", 256)], [("q", 30, 41)], sim_free_kv - 3, rejected=[("q", 41)])
    assert explain(real, sim) == reason
    same = record([("doc", 256)], [], 10)
    mix = MixComparison("m", [same, real, same], [same, sim, record([("doc", 200)], [], 10)])
    reasons = [r for *_, r in mix.differences()]
    assert reasons == ([reason, AFTER + reason] if reason else [None, None])


def test_the_benchmark_adds_up_engine_runs_and_tables_them(monkeypatch, tmp_path):
    from benchmarks import sim_agreement

    mixes = [random_mix(seed) for seed in range(5)]

    def fake_run(model_dir, part, setup, work_dir):
        arrivals = {r.rid: Arrival(0 if r.batch == 0 else 100, True, False) for mix in part for r in mix.requests}
        records = simulate(part, arrivals, setup, LIMITS.kv_pool_tokens)
        changed = copy.deepcopy(records)
        next(r for r in changed if r["admitted"])["admitted"][0][1] += 1
        report = compare(setup.name, part, changed, records)
        report.num_busy_arrivals = 1
        return report

    monkeypatch.setattr(sim_agreement, "compare_on_sglang", fake_run)
    total = sim_agreement.run_setup(tmp_path, mixes, SETUPS[0], tmp_path, per_engine=2)
    assert len(total.mixes) == 5 and total.num_busy_arrivals == 3 and len(total.unexplained) == 3
    table = sim_agreement.agreement_table([total])
    assert f"| {SETUPS[0].name} | 5 | 3 | {total.num_passes} " in table and table.endswith("| 3 | missed |")
    assert sim_agreement.differences([total]).count("(unexplained)") == 3
    assert "| mixes | 5 |" in sim_agreement.mix_table(mixes)


def test_the_benchmark_writes_its_result_file(monkeypatch, tmp_path):
    from benchmarks import sim_agreement
    from harness.results import latest

    def fake_run(model_dir, part, setup, work_dir):
        arrivals = {r.rid: Arrival(0 if r.batch == 0 else 100, True, False) for mix in part for r in mix.requests}
        records = simulate(part, arrivals, setup, LIMITS.kv_pool_tokens)
        return compare(setup.name, part, records, copy.deepcopy(records))

    monkeypatch.setattr(sim_agreement, "compare_on_sglang", fake_run)
    monkeypatch.setattr(sim_agreement, "build_tiny_model", lambda path, spec: path)
    assert sim_agreement.main(["--seeds", "3", "--first-seed", "5", "--work-dir", str(tmp_path)]) == 0
    text = latest("sim-agreement").read_text()
    assert "random mixes of seeds 5 to 7" in text and text.count("| 100.0% | none | 0 | met |") == len(SETUPS)


def test_a_request_left_out_without_a_kv_rejection_is_not_the_kv_bookkeeping():
    sim = record([("doc", 226), ("q", 30)], [("q", 30, 40)], 41)
    real = record([("doc", 256)], [("q", 30, 41)], 38)  # not admitted, but not rejected for KV either (slots)
    assert explain(real, sim) is None
