"""The real-sglang SLO benchmark's pieces at CI scale: its workload, the fit's error and the report, on made-up
runs (its figures come from real servers: `python -m benchmarks.slo_sglang`)."""

from __future__ import annotations

import pytest

from benchmarks import slo_sglang as bench


def run(doc_ttft_s: float, chat_ttft_s: list[float], gap_s: float = 0.05, timed=()) -> bench.RunResult:
    return bench.RunResult(
        doc_tokens=12_000,
        doc_ttft_s=doc_ttft_s,
        chat_ttft_s=chat_ttft_s,
        chat_gaps_s=[[gap_s] * 15 for _ in chat_ttft_s],
        span_s=10.0,
        timed_passes=list(timed),
    )


def timed(prefill_tokens: int, measured_s: float, predicted_s: float, pairs: float = 0.0, rows: int = 0) -> dict:
    return {
        "prefill_tokens": prefill_tokens,
        "prefill_ctx_pairs": pairs or prefill_tokens * (prefill_tokens + 1) / 2,
        "decode_rows": rows if prefill_tokens else max(rows, 1),
        "decode_ctx_tokens": 100 * (rows if prefill_tokens else max(rows, 1)),
        "measured_s": measured_s,
        "predicted_s": predicted_s,
    }


def test_the_workload_is_the_same_for_both_modes_and_chats_arrive_while_the_document_prefills():
    for r in range(20):
        plan = bench.schedule(r)
        assert plan == bench.schedule(r)  # drawn from the run's seed: both modes see the same run
        assert bench.DOC_TOKENS[0] <= plan.doc_tokens < bench.DOC_TOKENS[1]
        assert plan.chat_offsets_s and all(
            bench.CHAT_WINDOW_S[0] <= t <= bench.CHAT_WINDOW_S[1] for t in plan.chat_offsets_s
        )
        assert list(plan.chat_offsets_s) == sorted(plan.chat_offsets_s)


def test_the_fit_table_splits_prefill_from_decode_passes():
    rows = [timed(512, 0.1, 0.11), timed(0, 0.01, 0.008), timed(0, 0.01, 0.01), timed(2048, 0.4, 0.3)]
    lines = bench.fit_table(rows)
    assert lines[1].split("|")[1].strip() == "4"  # all passes
    assert lines[2].split("|")[1].strip() == "2" and "17.5%" in lines[2]  # with prefill: 10% and 25%
    assert lines[3].split("|")[1].strip() == "2" and "10.0%" in lines[3]  # decode only: 20% and 0%


def test_the_report_judges_each_mode_by_the_policys_targets(capsys):
    doc_s = 2.0
    results = {
        "fairshare": [run(doc_s * 1.05, [0.2, 0.3], timed=[timed(256, 0.1, 0.105)]), run(doc_s, [0.25, 0.45])],
        "upstream": [run(doc_s, [1.5, 2.5]), run(doc_s, [0.4, 3.0])],
    }
    bench.report(results, {"model": "fitted", "relative_error": 0.183})
    out = capsys.readouterr().out
    assert "median abs error 5.0% (target <= 15%): met" in out
    assert "the SLO sizer's margin on each predicted pass): 18.3%" in out
    assert f"fairshare: chat TTFT p99 0.450 s against {bench.TARGETS.ttft_s} s: met" in out
    assert "upstream: chat TTFT p99 3.000 s" in out and "missed by 2.50 s" in out
    assert "document throughput fairshare / upstream: 0.976" in out  # median of 1/1.05 and 1.0
    upstream = next(line for line in out.splitlines() if line.strip().startswith("upstream |"))
    assert "25.0%" in upstream  # one chat of four within 0.5 s


def test_the_noise_floor_is_the_spread_of_passes_with_the_same_figures():
    # Four decode passes of one shape at 10, 10, 12 and 8 ms (predicted by their median, 10 ms: misses 0, 0, 1/6,
    # 1/4 as the fit's are taken), and four chunks of another at 100, 110, 100 and 90 ms (misses 0, 1/11, 0, 1/9);
    # a lone pass of a third shape has no group and does not count.
    same = [timed(0, s, s) for s in (0.010, 0.010, 0.012, 0.008)]
    chunks = [timed(512, s, s) for s in (0.1, 0.11, 0.1, 0.09)]
    floor, grouped = bench.noise_floor([*same, *chunks, timed(4096, 0.9, 0.9)])
    assert grouped == 8
    assert floor == pytest.approx((0 + 1 / 11) / 2)  # the median of four zeros, 1/11, 1/9, 1/6 and 1/4
    # A different decode-row count, or a chunk twice as large, is another pass.
    other = [timed(0, 0.01, 0.01), timed(0, 0.01, 0.01, rows=2), timed(512, 0.1, 0.1), timed(1024, 0.2, 0.2)]
    assert bench.noise_floor(other * 3) == (None, 0)


def test_a_fit_target_below_the_noise_floor_is_reported_as_such(capsys):
    noisy = [timed(0, s, 0.01) for s in (0.006, 0.01, 0.014, 0.006, 0.014)]
    bench.report({"fairshare": [run(2.0, [0.2], timed=noisy)], "upstream": [run(2.0, [1.0])]}, None)
    # Predicted at their median (10 ms): misses 2/3, 0, 2/7, 2/3, 2/7 for the fit and the floor alike.
    assert "(target <= 15%): missed (the passes' noise floor is 28.6%: no model of their figures meets it)" in (
        capsys.readouterr().out
    )


def test_a_missed_fit_target_is_reported_as_missed(capsys):
    results = {"fairshare": [run(2.0, [0.2], timed=[timed(256, 0.1, 0.2)])], "upstream": [run(2.0, [1.0])]}
    bench.report(results, None)
    assert "median abs error 100.0% (target <= 15%): missed" in capsys.readouterr().out


def test_runs_must_be_positive():
    with pytest.raises(SystemExit):
        bench.main(["--runs", "0"])


def test_against_runs_the_plugin_on_both_servers_with_one_knob_changed(tmp_path):
    policy = bench.policy_knobs(["pass_throughput_slack=0.02", "admit_pass_long_tokens=0"], "--set")
    against = bench.policy_knobs(["admit_pass_long_tokens=none"], "--against")
    envs = bench.server_envs(tmp_path / "trace.jsonl", policy, against)
    assert list(envs) == ["fairshare", bench.BASELINE]
    mine, baseline = envs["fairshare"], envs[bench.BASELINE]
    assert mine["FAIRSHARE_ADMIT_PASS_LONG_TOKENS"] == "0" and baseline["FAIRSHARE_ADMIT_PASS_LONG_TOKENS"] == "none"
    assert mine["FAIRSHARE_PASS_THROUGHPUT_SLACK"] == baseline["FAIRSHARE_PASS_THROUGHPUT_SLACK"] == "0.02"
    assert "FAIRSHARE_PLUGIN_ENABLED" not in baseline and "FAIRSHARE_PASS_TRACE" not in baseline
    upstream = bench.server_envs(tmp_path / "trace.jsonl", policy, None)
    assert list(upstream) == ["fairshare", "upstream"] and upstream["upstream"]["FAIRSHARE_PLUGIN_ENABLED"] == "false"


@pytest.mark.parametrize(
    "pair", ["no_such_knob=1", "admit_pass_long_tokens", "admit_pass_long_tokens=-1", "ttft_target_s=soon"]
)
def test_a_bad_knob_is_refused_before_any_server_starts_naming_it(pair, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--runs", "1", "--against", pair])
    err = capsys.readouterr().err
    assert "--against" in err and pair.partition("=")[0] in err


def test_the_report_names_the_server_the_plugin_is_compared_with(capsys):
    results = {"fairshare": [run(2.0, [0.05])], bench.BASELINE: [run(2.1, [0.12])]}
    bench.report(results, None)
    out = capsys.readouterr().out
    assert "document throughput fairshare / baseline: 1.050" in out
    assert "baseline: chat TTFT p99 0.120 s" in out
