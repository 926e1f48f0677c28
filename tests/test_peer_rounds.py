"""The peer benchmark's rounds (`loadtests.peers --rounds`): the fronts take turns, forwards then backwards, each
started afresh each round, and each front's rounds are pooled into one result with the ratio of each round beside
it. No server: the fronts and the load generator are stand-ins that record what was asked of them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import ClassVar

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from harness import local_serve as sc
from loadtests import peers
from loadtests.peer_report import Front, front_cpu_ms, headline, pooled
from loadtests.peers import EngineSettings, Load, WorkloadResult, parse_args, round_order, run_workload
from loadtests.recording import Sample
from scheduler.config import PolicyConfig
from serve_app.config.knobs import EngineKnobs, RoutingKnobs


def chat(sent_s: float, ttft_s: float) -> Sample:
    return Sample("chat", "short", "short", 200, sent_s, ttft_s=ttft_s, e2e_s=1.0)


def document(sent_s: float, ttft_s: float) -> Sample:
    return Sample("doc", "long", "long", 200, sent_s, ttft_s=ttft_s, e2e_s=ttft_s, prompt_tokens=10_000)


def window(name: str, start_s: float, chat_ttft_s: float, doc_ttft_s: float, front_cores: float = 0.1) -> Front:
    """A 10 s window: 10 chats, one a second, and one document."""
    samples = [chat(start_s + i, chat_ttft_s) for i in range(10)] + [document(start_s, doc_ttft_s)]
    f = Front(name, samples, start_s, 1.0, 1.0)
    f.cpu_cores = {"front": front_cores}
    f.cpu_by_process = {"Serve's controller": front_cores}
    f.cpu_waiting_by_process = {"Serve's controller": front_cores / 2}
    return f


@given(st.lists(st.sampled_from(["fairshare", "fairshare-off", "cache_aware", "round_robin"]), unique=True, min_size=1))
def test_every_front_runs_once_a_round_forwards_then_backwards(fronts):
    orders = [round_order(fronts, r) for r in range(4)]
    assert all(sorted(o) == sorted(fronts) for o in orders)
    assert orders[0] == orders[2] == fronts and orders[1] == orders[3] == fronts[::-1]
    # Whichever front ends a round starts the next one: no front always runs first or always last.
    assert all(orders[r][-1] == orders[r + 1][0] for r in range(3))


def test_a_pooled_front_holds_every_rounds_samples_and_probes_and_no_time_between_them():
    first, second = window("fairshare", 0.0, 0.1, 2.0, front_cores=0.1), window("fairshare", 1000.0, 0.3, 1.0, 0.3)
    first.idle_ttft_s, second.idle_ttft_s = [0.05], [0.07]
    both = pooled([first, second])
    assert len(both.samples) == 22 and both.idle_ttft_s == [0.05, 0.07]
    assert both.span_s == pytest.approx(first.span_s + second.span_s) == pytest.approx(20.0)
    # Two equal spans: the front's cores are their mean, and its CPU per request is the two rounds' together.
    assert both.cpu_cores["front"] == pytest.approx(0.2) == both.cpu_by_process["Serve's controller"]
    assert both.cpu_waiting_by_process["Serve's controller"] == pytest.approx(0.1)
    assert front_cpu_ms(both) == pytest.approx(1e3 * (0.1 * 10 + 0.3 * 10) / 22)
    # One document a round, each alone: 20,000 tokens over 3 s of prefill, not over the 1,000 s between the rounds.
    assert both.figures["document prompt tokens/s"] == pytest.approx(20_000 / 3.0)


def test_the_headline_gives_the_pooled_ratio_and_each_rounds_beside_it():
    rounds = [
        [window("fairshare", 0.0, 0.1, 1.0), window("cache_aware", 100.0, 0.1, 2.0)],
        [window("cache_aware", 200.0, 0.1, 1.0), window("fairshare", 300.0, 0.1, 1.0)],
    ]
    lines = headline([("sessions", rounds)]).splitlines()
    # Documents: 2.00x in the first round, 1.00x in the second; pooled, 20,000 tokens in 2 s against 3 s.
    assert "| sessions | document prompt tokens/s (tok/s) | 10,000 | 6,667 | 1.50x | 2.00x, 1.00x |" in lines


class Recorder:
    """Stand-in fronts and load generator: what ran, in order, and each window's kv pools."""

    def __init__(self, broken: str = "") -> None:
        self.ran: list[str] = []
        self.pools: dict[str, list[int]] = {}
        self.broken = broken

    def starters(self, model, engine, out, renice=False, pools=None, variants=None):
        self.pools = pools

        def starter(name: str):
            @contextlib.contextmanager
            def start() -> Iterator[tuple[str, str]]:
                if name == self.broken:
                    raise RuntimeError("engine died")
                if name in self.pools:
                    self.pools[name].extend([65_536, 65_536])  # as a router front appends its servers' pools
                yield f"http://{name}", "tiny"

            return start

        return {n: starter(n) for n in (*peers.FRONTS, *(variants or {}))}

    def locust(self, url, name, flags, out, duration_s, locustfile, idle, stem=""):
        self.ran.append(stem)
        return window(name, 100.0 * len(self.ran), 0.1, 1.0)


def run(monkeypatch, tmp_path, rounds: int, broken: str = "") -> tuple[Recorder, WorkloadResult]:
    rec = Recorder(broken)
    monkeypatch.setattr(peers, "front_starters", rec.starters)
    monkeypatch.setattr(peers, "run_locust", rec.locust)
    monkeypatch.setattr(peers, "warm_up", lambda url, model: None)
    monkeypatch.setattr(peers, "idle_chat_ttfts", lambda url, model, cpt, seed: [0.05])
    args = parse_args(["--fronts", "fairshare,cache_aware", "--rounds", str(rounds)])
    load = Load("sessions", tmp_path / "locustfile.py", [], "made up")
    return rec, run_workload(load, args, tmp_path, EngineSettings(), tmp_path, 1.0)


def test_each_round_starts_every_front_afresh_in_alternating_order(monkeypatch, tmp_path):
    rec, result = run(monkeypatch, tmp_path, rounds=3)
    assert rec.ran == [
        *("fairshare.round1", "cache_aware.round1"),
        *("cache_aware.round2", "fairshare.round2"),
        *("fairshare.round3", "cache_aware.round3"),
    ]
    forwards, backwards = ["fairshare", "cache_aware"], ["cache_aware", "fairshare"]
    assert [[f.name for f in r] for r in result.rounds] == [forwards, backwards, forwards]
    # Each window carries the pools its own start reported, not every start's so far.
    assert all(f.kv_pool_tokens == [65_536, 65_536] for r in result.rounds for f in r if f.name == "cache_aware")
    pooled_fronts = {f.name: f for f in result.fronts}
    assert len(pooled_fronts["fairshare"].samples) == 3 * 11 and result.clean


def test_a_front_that_does_not_start_is_reported_and_not_tried_again(monkeypatch, tmp_path):
    rec, result = run(monkeypatch, tmp_path, rounds=2, broken="cache_aware")
    assert rec.ran == ["fairshare.round1", "fairshare.round2"]
    assert result.broken == {"cache_aware": "RuntimeError: engine died"} and not result.clean


def test_rounds_below_one_are_refused(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--rounds", "0"])
    assert "--rounds 0: must be at least 1" in capsys.readouterr().err


VARIANT = "fairshare+pass_throughput_slack=0.005+admit_pass_long_tokens=null"
LANES = "fairshare+long_lane_replicas=1+chat_spill=false"


class Deployed:
    """Stands in for LocalApp: records what each front would deploy (the policy override, the edited config)."""

    seen: ClassVar[list[tuple[dict, dict]]] = []

    def __init__(self, config_path, overrides, edit=None, **kw):
        cfg = yaml.safe_load(config_path.read_text())
        if edit is not None:
            edit(cfg)
        self.seen.append((overrides["policy"], cfg))

    def __enter__(self):
        raise RuntimeError("not started")  # nothing past the deploy is under test

    def __exit__(self, *exc):
        return False


def deploy(monkeypatch, tmp_path, fronts: list[str]) -> dict[str, tuple[dict, dict]]:
    """What each of `fronts` deploys: its engines' policy, and its config."""
    monkeypatch.setattr(peers, "LocalApp", Deployed)
    monkeypatch.setattr(Deployed, "seen", [])
    args = parse_args(["--fronts", ",".join(fronts)])
    starts = peers.front_starters(tmp_path, EngineSettings(), tmp_path, variants=args.variants)
    assert set(starts) == {*peers.FRONTS, *fronts}
    for name in fronts:
        with pytest.raises(RuntimeError, match="not started"), starts[name]():
            pass
    return dict(zip(fronts, Deployed.seen, strict=True))


def knobs(cfg: dict, deployment: str) -> dict:
    return {k: v for k, v in sc.deployment(cfg, deployment)["user_config"].items() if k != "policy"}


def test_a_policy_variant_is_this_app_with_those_policy_fields_over_the_shipped_ones(monkeypatch, tmp_path):
    deployed = deploy(monkeypatch, tmp_path, ["fairshare", VARIANT])
    shipped = peers.app_policy(EngineSettings(), upstream=False)
    (policy, cfg), (plain_policy, plain_cfg) = deployed[VARIANT], deployed["fairshare"]
    assert policy == {**shipped, "pass_throughput_slack": 0.005, "admit_pass_long_tokens": None}
    assert plain_policy == shipped  # the plain front is left as shipped
    assert cfg == plain_cfg  # nothing else moves
    assert peers.variant_notes(parse_args(["--fronts", f"fairshare,{VARIANT},cache_aware"]).variants) == [
        f"- `{VARIANT}`: **not as shipped**, this app with its engines' policy `pass_throughput_slack` 0.005, "
        "`admit_pass_long_tokens` None.\n"
    ]


def test_a_knob_variant_sets_the_engine_and_ingress_user_config_and_nothing_else(monkeypatch, tmp_path):
    deployed = deploy(monkeypatch, tmp_path, ["fairshare", LANES])
    (policy, cfg), (plain_policy, plain_cfg) = deployed[LANES], deployed["fairshare"]
    assert knobs(plain_cfg, "Engine")["long_lane_replicas"] is None  # as shipped: lanes follow the load
    assert knobs(cfg, "Engine") == {**knobs(plain_cfg, "Engine"), "long_lane_replicas": 1}
    assert knobs(cfg, "Ingress") == {**knobs(plain_cfg, "Ingress"), "chat_spill": False}
    assert policy == plain_policy
    for name in ("Engine", "Ingress"):  # each knob in its own deployment only
        sc.deployment(cfg, name)["user_config"] = sc.deployment(plain_cfg, name)["user_config"]
    assert cfg == plain_cfg
    assert peers.variant_notes(parse_args(["--fronts", LANES]).variants) == [
        f"- `{LANES}`: **not as shipped**, this app with its Engine deployment's `long_lane_replicas` 1; its "
        "Ingress deployment's `chat_spill` False.\n"
    ]


def test_no_field_lives_in_two_places():
    homes = [set(PolicyConfig.model_fields), set(EngineKnobs.model_fields) - {"policy"}, set(RoutingKnobs.model_fields)]
    assert all(not (a & b) for i, a in enumerate(homes) for b in homes[i + 1 :])


@pytest.mark.parametrize(
    ("front", "named"),
    [
        ("fairshare+no_such_field=1", "'no_such_field=1' is not FIELD=VALUE"),
        ("fairshare+pass_throughput_slack", "'pass_throughput_slack' is not FIELD=VALUE"),
        ("fairshare+pass_throughput_slack=-1", "not a valid PolicyConfig: Input should be greater than or equal to 0"),
        ("fairshare+pass_throughput_slack=abc", "valid number"),
        ("fairshare+long_lane_replicas=-1", "not a valid EngineKnobs: Input should be greater than or equal to 0"),
        ("fairshare+chat_spill=maybe", "not a valid RoutingKnobs: Input should be a valid boolean"),
        ("fairshare+policy=1", "'policy=1' is not FIELD=VALUE"),
        ("cache_aware+pass_throughput_slack=0.1", "unknown ['cache_aware+pass_throughput_slack=0.1']"),
    ],
)
def test_a_bad_variant_is_refused_naming_it(capsys, front, named):
    with pytest.raises(SystemExit):
        parse_args(["--fronts", f"fairshare,{front}"])
    assert named in capsys.readouterr().err
