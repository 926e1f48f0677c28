import json

import pytest

from scheduler.sim.cli import main


@pytest.mark.slow  # the whole reproduction again (test_reproduce checks its figures): `make test` runs it
def test_reproduce_json_rows(capsys):
    assert main(["reproduce", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {"case", "metric", "article", "sim", "ok"} <= set(rows[0])
    assert any(r["case"] == "patch F=409" and r["metric"] == "short TTFT s" for r in rows)


@pytest.mark.slow  # two whole runs and a matplotlib figure
def test_compare_prints_ratios_and_writes_a_plot(capsys, tmp_path):
    png = tmp_path / "cmp.png"
    assert (
        main(
            [
                "compare",
                "--scenario",
                "doc-4sessions",
                "--policy",
                "baseline",
                "--policy",
                "fairshare",
                "--json",
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    ttft = out["classes"]["short"]["TTFT p99 s"]
    assert ttft["baseline"]["ratio"] == 1.0 and ttft["fairshare"]["ratio"] < 0.01
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_rejects_an_unknown_policy_with_a_clear_message(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--scenario", "chunk-steps", "--policy", "nope"])
    assert exc.value.code == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err


def test_compare_rejects_a_bad_policy_option(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--scenario", "chunk-steps", "--policy", "fairshare:lookahead=-3"])
    assert "lookahead" in capsys.readouterr().err


def test_missing_workload_file_is_named(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--workload", "/nonexistent.yaml", "--policy", "fairshare"])
    assert "/nonexistent.yaml" in capsys.readouterr().err


@pytest.mark.slow  # three whole overload scenarios through the CLI
@pytest.mark.parametrize("scenario", ["kv-burst", "poisson-80", "doc-flood"])
def test_overload_scenarios_are_named_in_the_cli_and_sized_for_the_preset(capsys, scenario):
    assert main(["compare", "--scenario", scenario, "--preset", "h100-8b", "--policy", "fairshare", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workload"] == scenario and out["preset"] == "h100-8b"
    assert {"short", "long"} <= set(out["classes"])


def test_an_unknown_scenario_is_named(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--scenario", "poisson-99", "--policy", "fairshare"])
    assert "poisson-99" in capsys.readouterr().err


def test_compare_draws_the_arrivals_from_the_seed_it_is_given(capsys):
    def chat_ttft_p99(*seed: str) -> float:
        args = ["compare", "--scenario", "mixed-poisson", "--preset", "h100-8b", "--policy", "baseline", "--json"]
        assert main([*args, *seed]) == 0
        return json.loads(capsys.readouterr().out)["classes"]["short"]["TTFT p99 s"]["baseline"]["value"]

    own = chat_ttft_p99()
    assert chat_ttft_p99("--seed", "0") == own  # mixed-poisson's own seed
    assert chat_ttft_p99("--seed", "5") != own
