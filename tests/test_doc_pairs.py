"""`benchmarks.doc_pairs`: the passes it reads from the plugin's trace, its variants and its arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import doc_pairs
from scheduler.pass_trace import PassTraceWriter, timing_record
from scheduler.sglang_plugin.env import PASS_TRACE_VAR, explicit_policy_env


def test_only_the_documents_passes_count_from_every_engines_trace(tmp_path: Path) -> None:
    for i, prefills in enumerate(([5, 1500, 0, 1400], [2048, 99, 100])):
        writer = PassTraceWriter(tmp_path / f"trace-{i}.jsonl", source=f"sglang-tp{i}")
        for n, tokens in enumerate(prefills):
            writer.write(timing_record(n, tokens, 0.0, 0, 0, 0.1, 0.1))
    traces = [tmp_path / "trace-0.jsonl", tmp_path / "trace-1.jsonl", tmp_path / "absent.jsonl"]
    assert doc_pairs.passes_of(traces) == (4, 1500 + 1400 + 2048 + 100)


def test_each_variant_reaches_the_plugin_as_its_policy(tmp_path: Path) -> None:
    off = doc_pairs.server_env(doc_pairs.VARIANTS["plugin off"], tmp_path / "t")
    assert off["FAIRSHARE_PLUGIN_ENABLED"] == "false" and PASS_TRACE_VAR not in off
    for name in ("as shipped", "largest passes", "slack 0.05"):
        env = doc_pairs.server_env(doc_pairs.VARIANTS[name], tmp_path / "t")
        assert env[PASS_TRACE_VAR] == str(tmp_path / "t")
        assert explicit_policy_env(env) == doc_pairs.VARIANTS[name]
    assert (
        explicit_policy_env(doc_pairs.server_env(doc_pairs.VARIANTS["largest passes"], tmp_path))[
            "pass_throughput_slack"
        ]
        is None
    )


@pytest.mark.parametrize("argv", [["--pairs", "0"], ["--rounds", "0"]])
def test_a_count_below_one_is_refused_naming_it(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        doc_pairs.parse_args(argv)
    assert stop.value.code == 2 and f"{argv[0]} {argv[1]}" in capsys.readouterr().err
