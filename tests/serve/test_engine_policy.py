"""One policy on both sides of an sglang replica: the replica routes and sheds by the policy the plugin will run in
its engine, filled by the plugin's own function (`scheduler.sglang_plugin.policy.plugin_policy`) from the variables
and arguments the replica starts sglang with; what sglang computes only as it starts comes back in the plugin's
reported state (`serve_app.config.reported_policy`)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from scheduler.config import PolicyConfig
from scheduler.sglang_plugin.env import explicit_policy_env, policy_env
from scheduler.sglang_plugin.policy import plugin_policy, policy_config_for, scheduler_values
from scheduler.sglang_plugin.server_args import policy_server_args
from serve_app.config import (
    AppConfig,
    ConfigError,
    EngineKnobs,
    engine_policy,
    reported_policy,
    sglang_engine_kwargs,
    validate,
)
from serve_app.engines.sglang.load_snapshot import PrefillRate, replica_load
from serve_app.replica import engine_replica as engine_module
from serve_app.replica.backend import EngineCapacity
from serve_app.replica.engine_replica import backpressure_limits
from serve_app.routing.ttft_prediction import wait_pass_seconds
from tests.hypothesis_budget import examples
from tests.serve.fake_sglang import FakeSglangEngine, isolate_replica, release_backends

pytestmark = pytest.mark.filterwarnings("ignore:coroutine .*__del__' was never awaited:RuntimeWarning")

REPO = Path(__file__).resolve().parents[2]
FROM_MEMORY_MAX_RUNNING = 2048
"""What sglang sizes its concurrency limit to from memory when none is given (thousands on a GPU)."""
BY_GPU_CHUNK = 16384
"""What sglang sizes its chunk to by GPU when none is given."""


def gpu_config() -> tuple[dict[str, Any], dict[str, Any], int]:
    """config.gpu.yaml's application args, Engine user_config and Engine max_ongoing_requests."""
    app = yaml.safe_load((REPO / "config.gpu.yaml").read_text())["applications"][0]
    engine = next(d for d in app["deployments"] if d["name"] == "Engine")
    return app["args"], engine["user_config"], engine["max_ongoing_requests"]


def started_scheduler(kwargs: dict[str, Any], env: dict[str, str]) -> SimpleNamespace:
    """The values an sglang `Scheduler` started with `kwargs` and the `FAIRSHARE_*` environment `env` resolves,
    where it takes its arguments as given: the plugin's switches written onto the arguments first (its
    `ServerArgs.resolve_once` hook), then sglang 0.5.23's `Scheduler.init_chunked_prefill` and memory sizing."""
    args = {**kwargs, **{arg: v for arg, (v, _) in policy_server_args(explicit_policy_env(env)).items()}}
    chunk = args.get("chunked_prefill_size") or BY_GPU_CHUNK
    chunk = chunk if chunk > 0 else None
    return SimpleNamespace(
        chunked_prefill_size=chunk,
        max_prefill_tokens=args.get("max_prefill_tokens", 16384),
        max_running_requests=args.get("max_running_requests") or FROM_MEMORY_MAX_RUNNING,
        is_mixed_chunk=chunk is not None and bool(args.get("enable_mixed_chunk")),
        prefill_decode_interval=args.get("prefill_decode_interval", 0),
        enable_priority_scheduling=bool(args.get("enable_priority_scheduling")),
    )


@pytest.fixture
def isolated(monkeypatch):
    backends = isolate_replica(monkeypatch)
    yield
    release_backends(backends)


def started_replica(args: dict[str, Any], user_config: dict[str, Any]) -> Any:
    async def go():
        rep = engine_module.Engine.func_or_class(args)
        await rep.reconfigure(user_config)
        await rep.backend.shutdown()
        return rep

    return asyncio.run(go())


# -- the gpu config: sglang's concurrency limit, and backpressure by it -------------------------------------------


def test_the_gpu_configs_policy_is_sglangs_concurrency_limit_and_its_backpressure_follows_it():
    args, user_config, ongoing = gpu_config()
    cfg, knobs = validate(AppConfig, args, "args"), validate(EngineKnobs, user_config, "Engine.user_config")
    assert (cfg.sglang.max_running_requests, cfg.sglang.chunked_prefill_size) == (32, 8192)
    assert "max_running_requests" not in knobs.policy and knobs.max_queued_requests is None
    policy = engine_policy(cfg, knobs.policy)
    assert (policy.max_running_requests, policy.chunk_budget_tokens) == (32, 8192)
    limits = backpressure_limits(EngineCapacity(cfg.context_limit_tokens or 0), knobs, policy)
    assert limits.max_queued_requests == policy.prefill_concurrency == 2 * 32
    # Serve's in-flight limit (the only one on requests in flight) holds the running batch and the queue behind it.
    assert ongoing >= policy.max_running_requests + limits.max_queued_requests


def test_the_gpu_replica_starts_sglang_with_the_policy_it_sheds_by(isolated):
    args, user_config, _ = gpu_config()
    rep = started_replica(args, user_config)
    (engine,) = FakeSglangEngine.started
    assert rep.backend.policy.max_running_requests == 32
    assert rep.limits.max_queued_requests == 64
    # The plugin, in the engine the replica started (these arguments, this environment), fills the same policy.
    sched = started_scheduler(engine.kwargs, engine.env)
    os.environ.update(engine.env)  # the scheduler process inherits the replica's FAIRSHARE_* variables
    assert policy_config_for(sched) == rep.backend.policy


# -- the user's overrides win ----------------------------------------------------------------------------------------


def test_a_policy_override_wins_over_sglangs_arguments_on_both_sides(isolated):
    args, user_config, _ = gpu_config()
    overrides = {**user_config["policy"], "max_running_requests": 12, "chunk_budget_tokens": 4096}
    cfg = validate(AppConfig, args, "args")
    policy = engine_policy(cfg, overrides)
    assert (policy.max_running_requests, policy.chunk_budget_tokens, policy.cap_tokens) == (12, 4096, 4096 // 24)
    rep = started_replica(args, {**user_config, "policy": overrides})
    (engine,) = FakeSglangEngine.started
    assert engine.kwargs["max_running_requests"] == 32  # sglang's own limit stands in sglang ...
    assert engine.env["FAIRSHARE_MAX_RUNNING_REQUESTS"] == "12"  # ... and the plugin's policy takes the override
    assert rep.backend.policy == policy
    assert rep.limits.max_queued_requests == 2 * 12
    os.environ.update(engine.env)
    assert policy_config_for(started_scheduler(engine.kwargs, engine.env)) == policy


def test_the_backpressure_knob_still_wins_over_the_derived_limit(isolated):
    args, user_config, _ = gpu_config()
    rep = started_replica(args, {**user_config, "max_queued_requests": 5})
    assert rep.backend.policy.max_running_requests == 32 and rep.limits.max_queued_requests == 5


def test_a_bad_override_is_refused_by_name_as_the_plugin_would_parse_it():
    cfg = validate(AppConfig, gpu_config()[0], "args")
    for overrides, named in (
        ({"max_running_requests": 0}, "max_running_requests"),
        ({"max_running_requests": 4.5}, "max_running_requests"),  # the plugin reads "4.5": no integer
        ({"interactive_pass_tokens": 9000}, "interactive_pass_tokens"),  # above sglang's chunk of 8192
        ({"chunk_budget": 1}, "chunk_budget"),
    ):
        with pytest.raises(ConfigError, match=named):
            engine_policy(cfg, overrides)


# -- the same function on both sides, wherever sglang takes its arguments as given ----------------------------------

OVERRIDES = st.fixed_dictionaries(
    {},
    optional={
        "max_running_requests": st.integers(1, 256),
        "chunk_budget_tokens": st.sampled_from([256, 1024, 8192]),
        "mixed_decode": st.booleans(),
        "decode_steps_per_prefill": st.integers(0, 3),
        "skip_ahead": st.booleans(),
        "fair_share": st.booleans(),
        "long_pass_floor_tokens": st.sampled_from([0, 64]),
        "quiet_pass_tokens": st.sampled_from([None, 200]),
        "ttft_target_s": st.sampled_from([0.3, 0.8]),
    },
)
SETTINGS = st.fixed_dictionaries(
    {"model_path": st.just("/models/m"), "context_length": st.just(32768)},
    optional={
        "max_running_requests": st.integers(1, 512),
        "chunked_prefill_size": st.sampled_from([128, 512, 8192]),
        "engine_args": st.fixed_dictionaries(
            {},
            optional={
                "enable_priority_scheduling": st.booleans(),
                "max_prefill_tokens": st.sampled_from([4096, 16384]),
                "chunked_prefill_size": st.just(-1),
            },
        ),
    },
)


@settings(max_examples=examples(200), deadline=None, derandomize=True)
@given(OVERRIDES, SETTINGS)
def test_the_replicas_policy_is_the_plugins_for_the_engine_it_starts(overrides, settings_):
    """Where sglang takes the concurrency limit and chunk as given, the replica's policy is the plugin's exactly;
    where it computes one, the plugin's differs only there, and its report replaces the replica's prediction."""
    cfg = AppConfig(backend="sglang", sglang=settings_)
    env = policy_env(overrides)  # what the backend exports for the plugin
    try:
        policy = engine_policy(cfg, overrides)
    except ConfigError:
        sched = started_scheduler(sglang_engine_kwargs(cfg.sglang), env)
        with pytest.raises(ValidationError):  # the plugin refuses it as well, at start
            plugin_policy(explicit_policy_env(env), scheduler_values(sched))
        return
    kwargs = sglang_engine_kwargs(cfg.sglang, policy.mixed_decode)  # what the backend starts sglang with
    ran = plugin_policy(explicit_policy_env(env), scheduler_values(started_scheduler(kwargs, env)))
    computed = set()  # the policy fields whose sglang value sglang computes as it starts
    if "max_running_requests" not in kwargs:
        computed.add("max_running_requests")
    chunk = kwargs.get("chunked_prefill_size")
    if chunk is None or (chunk <= 0 and "max_prefill_tokens" not in kwargs):
        computed.add("chunk_budget_tokens")
    if computed - set(overrides):
        same = {f for f in PolicyConfig.model_fields if getattr(ran, f) == getattr(policy, f)}
        assert set(PolicyConfig.model_fields) - same <= computed | {"interactive_pass_tokens", "long_pass_floor_tokens"}
        assert reported_policy([None, {"status": "active", "policy": ran.model_dump()}], policy) == ran
    else:
        assert ran == policy
        assert reported_policy([{"policy": ran.model_dump()}], policy) is policy


# -- what sglang computes only as it starts: the plugin reports it -----------------------------------------------


def test_a_limit_sglang_sizes_from_memory_comes_back_from_the_plugin_and_the_limits_follow_it(isolated):
    args = {"backend": "sglang", "sglang": {"model_path": "/models/m", "context_length": 4096}}
    rep = started_replica(args, {})
    (engine,) = FakeSglangEngine.started
    predicted = rep.backend.policy
    assert predicted.max_running_requests == PolicyConfig.model_fields["max_running_requests"].default
    os.environ.update(engine.env)
    ran = policy_config_for(started_scheduler(engine.kwargs, engine.env))
    assert ran.max_running_requests == FROM_MEMORY_MAX_RUNNING
    state = {"status": "active", "policy": ran.model_dump(), "wait_pass_s": 0.2}
    assert reported_policy([], predicted) is predicted  # nothing reported yet
    assert reported_policy([{"status": "active"}], predicted) is predicted  # a plugin that reports no policy
    assert reported_policy([{"policy": {"max_running_requests": 0}}], predicted) is predicted  # one it cannot read
    reported = reported_policy([state], predicted)
    assert reported == ran
    limits = backpressure_limits(rep.backend.capacity(), rep.knobs, reported)
    assert limits.max_queued_requests == 2 * FROM_MEMORY_MAX_RUNNING


def test_the_load_carries_the_wait_bound_the_plugin_reports():
    policy = PolicyConfig(ttft_target_s=0.6)
    load = replica_load([], PrefillRate(), 0.0, policy, 8192)
    assert load.wait_pass_s == wait_pass_seconds(policy) == 0.3  # before the plugin reports: no engine figures
    states = [{"wait_pass_s": 0.21}, None, {"status": "active"}, {"wait_pass_s": 0.27}]
    assert replica_load([], PrefillRate(), 0.0, policy, 8192, plugin_states=states).wait_pass_s == 0.27
    assert replica_load([], PrefillRate(), 0.0, policy, 8192, plugin_states=[{"wait_pass_s": 0}]).wait_pass_s == 0


# -- the replica's environment, below the user's overrides ---------------------------------------------------------


def test_the_replicas_policy_variables_apply_below_the_user_config_on_both_sides(isolated):
    """As on the simulated engine: a `FAIRSHARE_*` policy variable of the replica's environment (runtime_env, a
    container's env) sets its knob unless `Engine.user_config.policy` names it; the engine's plugin runs the same."""
    args, user_config, _ = gpu_config()
    os.environ.update({"FAIRSHARE_TTFT_TARGET_S": "0.9", "FAIRSHARE_TBT_TARGET_S": "0.7"})
    rep = started_replica(args, {**user_config, "policy": {**user_config["policy"], "tbt_target_s": 0.4}})
    (engine,) = FakeSglangEngine.started
    assert (rep.backend.policy.ttft_target_s, rep.backend.policy.tbt_target_s) == (0.9, 0.4)
    assert (engine.env["FAIRSHARE_TTFT_TARGET_S"], engine.env["FAIRSHARE_TBT_TARGET_S"]) == ("0.9", "0.4")
    os.environ.update(engine.env)
    assert policy_config_for(started_scheduler(engine.kwargs, engine.env)) == rep.backend.policy


def test_a_bad_policy_variable_in_the_replicas_environment_is_refused_by_name(isolated):
    args, user_config, _ = gpu_config()
    os.environ["FAIRSHARE_LOOKAHEAD"] = "many"
    with pytest.raises(ConfigError, match="lookahead"):
        started_replica(args, user_config)
