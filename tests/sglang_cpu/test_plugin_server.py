"""The plugin inside a real sglang server (``python -m sglang.launch_server``, tiny model, CPU).

One server with the plugin and its pass trace on serves every test here; others with the plugin switched
off (one of them with its clock timing upstream's prefill call) serve the comparisons. Decisions are read from the
plugin's pass trace and sglang's own counters, never from timing: a request is sent once the trace shows the state
the test needs.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cpu_env import CPU_SERVER_ARGS, cpu_sglang_env
from harness.sglang_server import PLUGIN_START_LINE, LocalServer
from harness.sglang_traffic import Generation, load, prompt_ids, trace_since, wait_for, wait_idle
from scheduler.pass_cost import AttentionWork, chunk_ctx_pairs, extend_pairs
from scheduler.pass_trace import read_pass_timings, read_pass_trace
from scheduler.sglang_plugin.clock import PassKind, read_clock

pytestmark = [pytest.mark.sglang_cpu, pytest.mark.timeout(1200)]  # server starts on a loaded 2-core CPU

POOL_TOKENS = 6000
SERVER_ARGS = [
    *CPU_SERVER_ARGS,
    "--chunked-prefill-size",
    "128",
    "--max-running-requests",
    "4",
    "--max-total-tokens",
    str(POOL_TOKENS),
    "--dtype",
    "float32",  # the on/off comparison is token for token: no bf16 ties between chunkings
    "--log-level",
    "info",
]


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("trace") / "passes.jsonl"


@pytest.fixture(scope="module")
def clock_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("clock") / "plugin-clock.jsonl"


@pytest.fixture(scope="module")
def server(tiny_model_dir, trace_path, clock_path, tmp_path_factory) -> Iterator[LocalServer]:
    # Empty policy variables count as unset (defect 5: they killed the server or changed F before).
    env = cpu_sglang_env(pass_trace=trace_path, plugin_clock=clock_path, mixed_decode="", max_running_requests="")
    log = tmp_path_factory.mktemp("server-on") / "sglang.log"
    with LocalServer(tiny_model_dir, SERVER_ARGS, env, log) as srv:
        yield srv


def admitted_tokens(records: list[dict], rid: str) -> int:
    return sum(tokens for rec in records for r, tokens in rec["admitted"] if r == rid)


def admitted_in(rec: dict) -> set[str]:
    return {rid for rid, _ in rec["admitted"]}


def test_start_line_once_per_scheduler_and_the_launcher_sees_the_policy(server):
    log = server.log_text()
    assert log.count(PLUGIN_START_LINE) == 1, server.log_tail()
    assert "max_running_requests=4 (sglang max_running_requests)" in log  # the empty variable left F to sglang
    assert "fairshare: scheduler 0: policy active" in log  # the launcher checked the handshake
    assert server.request("GET", "/get_server_info")["fairshare"] == "active"


def test_short_request_arriving_during_a_long_prefill_runs_in_the_next_pass(server, trace_path):
    start = len(read_pass_trace(trace_path))
    doc = Generation(server, "doc-live", prompt_ids(4000, seed=11), 4)
    wait_for(
        "the document's first chunk", lambda: any("doc-live" in admitted_in(r) for r in trace_since(trace_path, start))
    )
    question = Generation(server, "q-live", prompt_ids(30, seed=12), 4)
    assert doc.finish_reason == "length" and question.finish_reason == "length"
    records = trace_since(trace_path, start)
    first_seen = next(r for r in records if any(rid == "q-live" for rid, *_ in r["judged"]))
    assert [c[0] for c in first_seen["continuing"]] == ["doc-live"], "the document had finished its prefill"
    assert "q-live" in admitted_in(first_seen)
    assert admitted_tokens(records, "doc-live") == 4000 and admitted_tokens(records, "q-live") == 30
    wait_idle(server)


def test_skip_ahead_past_a_kv_rejection_loses_and_duplicates_nothing(server, trace_path):
    start = len(read_pass_trace(trace_path))
    prompts = {"holder": prompt_ids(3500, seed=21), "big": prompt_ids(3500, seed=22), "small": prompt_ids(30, seed=23)}
    holder = Generation(server, "holder", prompts["holder"], 600)  # decodes long, holding its KV
    wait_for("the holder's prefill", lambda: admitted_tokens(trace_since(trace_path, start), "holder") == 3500)
    big = Generation(server, "big", prompts["big"], 4)

    def big_rejected():
        return any(rej[0] == "big" and rej[3] for r in trace_since(trace_path, start) for rej in r["rejections"])

    wait_for("a KV-capacity rejection of the second document", big_rejected)
    small = Generation(server, "small", prompts["small"], 4)
    assert small.finish_reason == "length"
    assert holder.is_alive(), "the holder finished before the small request: nothing was skipped"
    records = trace_since(trace_path, start)
    admitting_small = next(r for r in records if "small" in admitted_in(r))
    assert [rej[0] for rej in admitting_small["rejections"]] == ["big"] and admitting_small["rejections"][0][3]
    assert all(finished.finish_reason == "length" for finished in (holder, big))
    records = trace_since(trace_path, start)
    assert {rid: admitted_tokens(records, rid) for rid in prompts} == {rid: len(p) for rid, p in prompts.items()}
    first_admission = Counter(next(i for i, r in enumerate(records) if rid in admitted_in(r)) for rid in prompts)
    assert sorted(first_admission.values()) == [1, 1, 1]  # each admitted in its own pass, once
    assert records.index(admitting_small) < next(i for i, r in enumerate(records) if "big" in admitted_in(r))
    wait_idle(server)


def test_abort_of_a_running_and_a_queued_request_frees_their_kv(server, trace_path):
    start = len(read_pass_trace(trace_path))
    running = Generation(server, "run-a", prompt_ids(3500, seed=31), 3000)
    wait_for("the running request's prefill", lambda: admitted_tokens(trace_since(trace_path, start), "run-a") == 3500)
    queued = Generation(server, "queued-b", prompt_ids(3500, seed=32), 4)
    wait_for(
        "the queued request's KV rejection",
        lambda: any(rej[0] == "queued-b" for r in trace_since(trace_path, start) for rej in r["rejections"]),
    )
    # sglang's load counters are a snapshot refreshed by the scheduler loop: poll until they show the queue
    before = wait_for("the counters to show the queued request", lambda: (s := load(server))["num_waiting_reqs"] and s)
    assert before["num_used_tokens"] >= 3500 and before["num_waiting_reqs"] == 1

    server.request("POST", "/abort_request", {"rid": "queued-b"})
    assert queued.finish_reason == "abort"
    after_queued = wait_for("the queue to empty", lambda: (s := load(server))["num_waiting_reqs"] == 0 and s)
    assert after_queued["num_running_reqs"] == 1 and after_queued["num_used_tokens"] >= 3500

    server.request("POST", "/abort_request", {"rid": "run-a"})
    assert running.finish_reason == "abort"
    idle = wait_for("the KV to be freed", lambda: (s := wait_idle(server))["num_used_tokens"] == 0 and s)
    assert idle["num_running_reqs"] == 0 and idle["num_waiting_reqs"] == 0


def test_every_pass_is_timed_where_its_result_lands_and_fitted(server, trace_path):
    wait_idle(server)
    start = len(read_pass_timings(trace_path))
    planned = len(read_pass_trace(trace_path))
    Generation(server, "timed", prompt_ids(700, seed=77), max_new_tokens=20).finish()
    wait_idle(server)
    timed = read_pass_timings(trace_path)[start:]
    state = server.request("GET", "/server_info")["internal_states"][0]["fairshare"]
    # What the fit was fed, counted: the request's chunks, each attending as the engine computes it (the CPU test
    # engine's extend, `harness.cpu_attention`: the chunk's queries against its context, as on a GPU, so the chunks
    # add up to the whole prompt's pairs), then one decode row per token after the first, each attending to its
    # whole sequence.
    assert state["pass_cost"]["attention"] == AttentionWork.QUERIES
    assert sum(t["prefill_tokens"] for t in timed) == 700
    starts = itertools.accumulate((t["prefill_tokens"] for t in timed), initial=0)
    chunks = [extend_pairs(AttentionWork.QUERIES, s, t["prefill_tokens"]) for s, t in zip(starts, timed, strict=False)]
    assert len(chunks) > 1 and sum(t["prefill_ctx_pairs"] for t in timed) == sum(chunks) == chunk_ctx_pairs(0, 700)
    assert sum(t["decode_rows"] for t in timed) == 19
    assert sum(t["decode_ctx_tokens"] for t in timed) == sum(700 + i for i in range(1, 20))
    assert all(t["measured_s"] > 0 and t["predicted_s"] > 0 for t in timed)
    # The planned passes carry the model they were planned with; sglang's internal state has the live one.
    assert all("pass_cost" in r for r in read_pass_trace(trace_path)[planned:])
    assert state["status"] == "active" and state["timed_passes"] == len(read_pass_timings(trace_path))
    # sglang's overlap loop (its default, kept unless `cpu_overlap_schedule` is false): on CPU the launch runs the
    # pass, so a chat's first token leaves after the next pass.
    assert (state["admission_lag_passes"], state["output_lag_passes"]) == (0, 1)
    fit = state["pass_cost"]
    assert fit["model"] == "fitted" and fit["observed_passes"] == state["timed_passes"] and fit["frozen"] is None


MIXED_BATCH = {
    "doc-a": (prompt_ids(1500, seed=41), 6),
    "doc-b": (prompt_ids(900, seed=42), 6),
    "q-a": (prompt_ids(20, seed=43), 6),
    "q-b": (prompt_ids(35, seed=44), 6),
    "q-c": (prompt_ids(12, seed=45), 6),
}


def run_mixed_batch(server: LocalServer) -> dict[str, list[int]]:
    gens = [Generation(server, f"{rid}-{server.port}", ids, n) for rid, (ids, n) in MIXED_BATCH.items()]
    return {rid: g.finish()["output_ids"] for rid, g in zip(MIXED_BATCH, gens, strict=True)}


def test_greedy_outputs_are_identical_with_the_plugin_on_and_off(server, tiny_model_dir, trace_path, tmp_path):
    start = len(read_pass_trace(trace_path))
    with_plugin = run_mixed_batch(server)
    records = trace_since(trace_path, start)
    assert any(g[2] for r in records for g in r["grants"]), "the batch ran no cut (fair-share) pass"
    env = cpu_sglang_env(plugin_enabled=0)
    with LocalServer(tiny_model_dir, SERVER_ARGS, env, tmp_path / "sglang-off.log") as off:
        without_plugin = run_mixed_batch(off)
        assert PLUGIN_START_LINE not in off.log_text()  # switched off: the scheduler logs no policy
        assert "fairshare" not in off.request("GET", "/get_server_info")
    assert with_plugin == without_plugin
    assert all(len(ids) == 6 for ids in with_plugin.values())


def clock_passes(server: LocalServer, clock: Path) -> list:
    """The passes the clock has appended; none yet, another batch: it appends at the first pass at least 0.5 s
    after its last append."""
    passes, _ = read_clock(clock)
    if not passes:
        run_mixed_batch(server)
    return passes


def test_switched_off_with_its_clock_on_upstreams_call_is_timed_and_no_output_changes(server, tiny_model_dir, tmp_path):
    clock = tmp_path / "upstream-clock.jsonl"
    env = cpu_sglang_env(plugin_enabled=0, plugin_clock=clock)
    with LocalServer(tiny_model_dir, SERVER_ARGS, env, tmp_path / "sglang-off-clocked.log") as off:
        outputs = run_mixed_batch(off)
        assert PLUGIN_START_LINE not in off.log_text()
        passes = wait_for("the clock's first append", lambda: clock_passes(off, clock))
    assert all(p.kind is PassKind.NONE and p.ns == 0 and p.call_ns > 0 for p in passes)
    assert outputs == run_mixed_batch(server)


def test_the_clock_times_the_plugins_work_in_every_iteration_decode_only_ones_included(server, clock_path):
    Generation(server, "clocked", prompt_ids(100, seed=78), max_new_tokens=20).finish()
    passes = wait_for("the clock's first append", lambda: clock_passes(server, clock_path))
    assert all(p.outside_ns is not None for p in passes)
    # Decode-only iterations plan nothing (sglang returns before building an adder), yet the plugin times each pass
    # where its result lands and feeds the fit: that work is in the record.
    decode_only = [p for p in passes if p.kind is PassKind.NONE]
    assert len(decode_only) >= 19 and sum(p.outside_ns > 0 for p in decode_only) >= 19
