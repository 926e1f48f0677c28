"""config.yaml and config.gpu.yaml against Ray's own schema, and our typed config's error messages."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from serve_app.app import ROUTER_CLASS, build_app
from serve_app.config import AppConfig, ConfigError, EngineKnobs, RoutingKnobs, validate
from serve_app.config.serve_path import (
    CONTROLLER_ENV,
    FRONT_ENV,
    INGRESS_DRAIN_ENV,
    PYTHON_PROXY_ENV,
    SERVE_PATH_ENV,
    WORKER_PRIORITY_ENV,
    controller_problems,
    front_of,
    front_problems,
    serve_path_problems,
)

REPO = Path(__file__).resolve().parents[2]


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


@pytest.mark.parametrize("name", ["config.yaml", "config.card12gb.yaml", "config.gpu.yaml", "config.sglang-cpu.yaml"])
def test_config_files_pass_serve_schema_and_ours(name: str) -> None:
    raw = load(name)
    schema = ServeDeploySchema.model_validate(raw)
    assert schema.http_options.host == "127.0.0.1"
    (app,) = schema.applications
    assert app.import_path == "serve_app.app:build_app"
    deployments = {d.name: d for d in app.deployments}
    assert set(deployments) == {"Ingress", "Engine", "Embedder"}  # Serve ignores unknown names silently: check them
    # Unknown keys inside deployment entries vanish in Serve's schema: compare with the raw file.
    for d in raw["applications"][0]["deployments"]:
        assert set(d) <= set(type(deployments[d["name"]]).model_fields), d["name"]
    # Serve's request path on each replica's own loop, logs and the proxy as Serve's defaults have them.
    assert serve_path_problems((app.runtime_env or {}).get("env_vars")) == []
    # Serve's high-throughput front (HAProxy, direct ingress), in the controller's and the app's environment.
    assert front_of(raw["controller_options"]["runtime_env"]["env_vars"]) == "haproxy"
    assert front_of((app.runtime_env or {}).get("env_vars")) == "haproxy"
    # Serve's controller on its slower loop, through Serve's own option (it validates the block above).
    assert controller_problems(raw.get("controller_options")) == []
    assert schema.controller_options is not None
    engine = deployments["Engine"]
    assert engine.request_router_config["request_router_class"] == ROUTER_CLASS
    cfg = validate(AppConfig, app.args, "args")
    knobs = validate(EngineKnobs, engine.user_config, "Engine.user_config")
    validate(RoutingKnobs, deployments["Ingress"].user_config, "Ingress.user_config")
    if name in ("config.yaml", "config.card12gb.yaml"):
        assert 0 < knobs.long_lane_replicas < engine.num_replicas  # static lanes: the sim's two lanes
    else:
        assert knobs.long_lane_replicas is None  # real engines: lanes follow the load
    # The embeddings deployment sheds what it cannot queue (429 at the ingress), never an unbounded queue.
    assert cfg.embeddings is not None and deployments["Embedder"].max_queued_requests > 0
    if name in ("config.yaml", "config.card12gb.yaml"):
        assert cfg.backend == "sim" and engine.num_replicas == 2
    elif name == "config.sglang-cpu.yaml":
        assert cfg.backend == cfg.embeddings.backend == "sglang" and engine.num_replicas == 2
        assert cfg.sglang.engine_args["device"] == cfg.embeddings.engine_args["device"] == "cpu"
    else:
        assert cfg.backend == "sglang" and engine.num_replicas == 4
        assert engine.ray_actor_options.num_gpus == 1
        assert deployments["Embedder"].ray_actor_options.num_gpus == 1
    build_app(app.args)


def test_laptop_default_is_a_current_gpu_and_the_articles_card_is_one_line_away() -> None:
    default, card = load("config.yaml"), load("config.card12gb.yaml")
    assert AppConfig.model_validate(default["applications"][0]["args"]).served_model_id == "sim-h100-8b"
    assert card["applications"][0]["args"]["sim"].pop("preset") == "card12gb-27b"
    assert default["applications"][0]["args"]["sim"].pop("preset") == "h100-8b"
    assert card == default


def test_one_place_for_the_short_long_threshold_and_mixed_decode() -> None:
    # The routers take the threshold from the engines' policy; sglang's interleave arguments are the policy's.
    with pytest.raises(ConfigError, match="long_prompt_tokens"):
        validate(RoutingKnobs, {"long_prompt_tokens": 4096}, "Ingress.user_config")
    with pytest.raises(ConfigError, match="enable_mixed_chunk"):
        validate(AppConfig, {"backend": "sglang", "sglang": {"model_path": "m", "enable_mixed_chunk": True}}, "args")
    with pytest.raises(ConfigError, match="prefill_decode_interval"):
        validate(
            AppConfig,
            {
                "backend": "sglang",
                "sglang": {"model_path": "m", "context_length": 8, "engine_args": {"prefill_decode_interval": 2}},
            },
            "args",
        )


def test_bad_values_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"args\.sim\.preset: .*unknown preset.*got 'nope'"):
        validate(AppConfig, {"sim": {"preset": "nope"}}, "args")
    with pytest.raises(ConfigError, match=r"args\.backend"):
        validate(AppConfig, {"backend": "vllm"}, "args")
    with pytest.raises(ConfigError, match=r"args.*model_path"):
        validate(AppConfig, {"backend": "sglang"}, "args")
    with pytest.raises(ConfigError, match=r"Engine\.user_config\.time_scale.*-1"):
        validate(EngineKnobs, {"time_scale": -1}, "Engine.user_config")
    with pytest.raises(ConfigError, match=r"unknown PolicyConfig field.*chunk_budget"):
        validate(EngineKnobs, {"policy": {"chunk_budget": 4096}}, "Engine.user_config")
    with pytest.raises(ConfigError, match=r"Ingress\.user_config\.busy_pending_requests"):
        validate(RoutingKnobs, {"busy_pending_requests": 0}, "Ingress.user_config")
    with pytest.raises(ConfigError, match=r"Ingress\.user_config\.long_prompt_tokens"):
        validate(RoutingKnobs, {"long_prompt_tokens": 10}, "Ingress.user_config")  # now the policy's knob


def test_check_cli_accepts_the_shipped_files_and_names_bad_fields(tmp_path, capsys) -> None:
    from serve_app.config.check import main

    assert main([str(REPO / "config.yaml")]) == 0
    assert main([str(REPO / "config.gpu.yaml")]) == 0
    raw = load("config.yaml")
    engine = next(d for d in raw["applications"][0]["deployments"] if d["name"] == "Engine")
    engine["user_config"]["policy"] = {"max_running_requests": 0}
    engine["num_replica"] = 3  # a typo Serve would drop silently
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    assert main([str(bad)]) == 1
    out = capsys.readouterr().out
    assert "Engine.user_config.policy.max_running_requests" in out
    assert "keys Serve would ignore: ['num_replica']" in out


def test_check_cli_answers_bad_arguments_with_a_message_not_a_traceback(tmp_path, capsys) -> None:
    from serve_app.config.check import main

    with pytest.raises(SystemExit) as usage:
        main(["--help"])
    assert usage.value.code == 0 and "python -m serve_app.config.check" in capsys.readouterr().out
    assert main([str(tmp_path / "missing.yaml")]) == 2
    (tmp_path / "text.yaml").write_text("just text")
    assert main([str(tmp_path / "text.yaml")]) == 2
    (tmp_path / "broken.yaml").write_text("a: [b")
    assert main([str(tmp_path / "broken.yaml")]) == 2
    err = capsys.readouterr().err
    assert "missing.yaml: cannot read it as YAML" in err and "text.yaml: not a Serve config" in err
    assert "broken.yaml: cannot read it as YAML" in err and "Traceback" not in err


@pytest.mark.parametrize("name", ["config.yaml", "config.card12gb.yaml", "config.gpu.yaml", "config.sglang-cpu.yaml"])
def test_the_ingress_drains_as_long_as_the_engines_it_relays(name: str) -> None:
    from serve_app.config.check import drain_problems

    deployments = load(name)["applications"][0]["deployments"]
    assert drain_problems("app", deployments) == []
    engine = next(d for d in deployments if d["name"] == "Engine")
    engine["graceful_shutdown_timeout_s"] = 600  # an Ingress left on Serve's 20 s (or its own) would cut streams
    (problem,) = drain_problems("app", deployments)
    assert "Ingress: graceful_shutdown_timeout_s=" in problem and "Engine's (600)" in problem


def test_serve_path_check_names_a_missing_knob() -> None:
    good = dict(SERVE_PATH_ENV)
    assert serve_path_problems(good) == []
    assert serve_path_problems({**good, "PYTHONPATH": "x"}) == []  # other variables are the app's own
    missing = {k: v for k, v in good.items() if k != "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP"}
    assert [p.split(":")[0] for p in serve_path_problems(missing)] == ["RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP"]
    assert len(serve_path_problems(None)) == len(SERVE_PATH_ENV)


def test_front_is_asked_for_in_both_places_or_neither() -> None:
    controller = {"runtime_env": {"env_vars": {**CONTROLLER_ENV}}}
    assert front_of(FRONT_ENV) == "haproxy" and front_problems(controller, FRONT_ENV) == []
    # The switch back to Serve's Python proxy: both variables off in both places, or absent from both.
    off = {"runtime_env": {"env_vars": {**CONTROLLER_ENV, **PYTHON_PROXY_ENV}}}
    assert front_of(PYTHON_PROXY_ENV) == "proxy" and front_problems(off, PYTHON_PROXY_ENV) == []
    assert front_problems(None, None) == []
    # HAProxy started by the controller with no HTTP server in the ingress replica (or the reverse) serves nothing.
    (problem,) = front_problems(controller, None)
    assert "'haproxy'" in problem and "'proxy'" in problem
    assert len(front_problems(None, FRONT_ENV)) == 1
    half = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}
    assert front_of(half) == "mixed" and len(front_problems({"runtime_env": {"env_vars": half}}, half)) == 1


def test_the_checker_refuses_a_config_whose_front_is_set_in_one_place() -> None:
    from serve_app.config.check import problems

    raw = load("config.yaml")
    assert problems(raw) == []
    for k in FRONT_ENV:
        del raw["applications"][0]["runtime_env"]["env_vars"][k]
    (problem,) = problems(raw)
    assert problem.startswith("applications[fairshare]: front:")


def test_the_checker_refuses_an_ingress_drain_set_in_one_place_only() -> None:
    from serve_app.config.check import problems

    (key,) = INGRESS_DRAIN_ENV
    raw = load("config.yaml")
    del raw["applications"][0]["runtime_env"]["env_vars"][key]  # the replica would hold itself open Serve's 30 s
    (problem,) = problems(raw)
    assert problem.startswith(f"applications[fairshare]: {key}: controller_options has '5'") and "None" in problem
    del raw["controller_options"]["runtime_env"]["env_vars"][key]  # Serve's default in both places: consistent
    assert problems(raw) == []


def test_controller_check_names_a_missing_or_changed_loop_interval_or_drain() -> None:
    keys = [k for k in CONTROLLER_ENV if k not in FRONT_ENV]
    assert keys == ["RAY_SERVE_CONTROL_LOOP_INTERVAL_S", *INGRESS_DRAIN_ENV, *WORKER_PRIORITY_ENV]
    good = {"runtime_env": {"env_vars": {**CONTROLLER_ENV, "OTHER": "x"}}}
    assert controller_problems(good) == []
    assert [p.split(":")[0] for p in controller_problems(None)] == [
        f"controller_options.runtime_env.env_vars.{k}" for k in keys
    ]
    for key in keys:
        changed = {"runtime_env": {"env_vars": {**CONTROLLER_ENV, key: "30"}}}
        (problem,) = controller_problems(changed)
        assert problem.startswith(f"controller_options.runtime_env.env_vars.{key}: '30'")
    assert len(controller_problems({"runtime_env": None})) == len(keys)
