"""Every policy switch reaches the plugin; F follows sglang's limits and is logged at start; mixed decode and
the decode interval are sglang's own arguments; where the policy cannot hold, upstream's rules apply."""

import dataclasses
import logging
import math
from collections import defaultdict

import pytest
from sglang.srt.arg_groups.overrides import resolving_view
from sglang.srt.managers.schedule_policy import PrefillAdder
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.server_args import ServerArgs

from harness.sglang_classes import UPSTREAM_ADDER_CLASS, EngineSpec, Harness, ReqSpec, build_scheduler
from scheduler.config import PolicyConfig, env_var_name
from scheduler.pass_trace import read_pass_trace
from scheduler.sglang_plugin import attach as attach_mod
from scheduler.sglang_plugin import hooks, loading
from scheduler.sglang_plugin.attach import attach_policy, policy_config_for, policy_of
from scheduler.sglang_plugin.server_args import apply_policy_env

SEED_ENGINE = EngineSpec(pool_tokens=65_536, chunk_tokens=8192, max_running=10)

# A valid value other than the default for every knob the environment sets.
SWITCH_VALUES = {
    "skip_ahead": ("false", False),
    "lookahead": ("3", 3),
    "max_skipped_passes": ("7", 7),
    "fair_share": ("false", False),
    "tenant_fairness": ("false", False),
    "tenant_weights": ('{"acme": 2}', {"acme": 2.0}),
    "full_budget_when_alone": ("false", False),
    "chunk_budget_tokens": ("4096", 4096),
    "max_running_requests": ("5", 5),
    "per_request_cap_tokens": ("300", 300),
    "adaptive_pass": ("false", False),
    "short_request_tokens": ("500", 500),
    "interactive_pass_tokens": ("256", 256),
    "short_pass_extra_tokens": ("16", 16),
    "activity_window_passes": ("4", 4),
    "quiet_pass_tokens": ("900", 900),
    "diagnostics": ("true", True),
    "interactive_reserve": ("false", False),
    "reserve_slots": ("2", 2),
    "reserve_kv_tokens": ("3000", 3000),
    "short_decode_interleave": ("false", False),
    "slo_sizing": ("false", False),
    "ttft_target_s": ("0.8", 0.8),
    "tbt_target_s": ("0.4", 0.4),
    "delivery_margin_s": ("0.02", 0.02),
    "long_pass_floor_tokens": ("200", 200),
    "missed_pass_stretch": ("3.0", 3.0),
    "slot_aware_passes": ("false", False),
    "pass_overrun_quantile": ("0.75", 0.75),
    "pass_throughput_slack": ("0.05", 0.05),
    "admit_pass_long_tokens": ("0", 0),
    "cpu_overlap_schedule": ("false", False),
}
SGLANG_OWNED = {"mixed_decode": "enable_mixed_chunk", "decode_steps_per_prefill": "prefill_decode_interval"}


def test_every_policy_switch_is_honoured(monkeypatch):
    assert set(PolicyConfig.model_fields) == set(SWITCH_VALUES) | set(SGLANG_OWNED), "a new knob needs a test value"
    for field, (raw, _) in SWITCH_VALUES.items():
        monkeypatch.setenv(env_var_name(field), raw)
    cfg = policy_config_for(build_scheduler(SEED_ENGINE, patched=True))
    assert {f: getattr(cfg, f) for f in SWITCH_VALUES} == {f: v for f, (_, v) in SWITCH_VALUES.items()}
    fit = attach_policy(build_scheduler(SEED_ENGINE, patched=True)).pass_cost
    assert fit.settings.overrun_quantile == 0.75  # the fit's stated error is the operator's quantile


def test_f_is_derived_from_sglangs_limits_and_logged_at_start(caplog):
    caplog.set_level(logging.INFO, logger="fairshare")
    plugin = Harness(SEED_ENGINE, [])
    assert (plugin.policy.cfg.max_running_requests, plugin.policy.cfg.chunk_budget_tokens) == (10, 8192)
    assert "Prefill concurrency N=20: long_prefill_token_threshold=409" in caplog.messages


def test_environment_wins_over_sglangs_values(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="fairshare")
    monkeypatch.setenv("FAIRSHARE_MAX_RUNNING_REQUESTS", "4")
    monkeypatch.setenv("FAIRSHARE_CHUNK_BUDGET_TOKENS", "4096")
    assert Harness(SEED_ENGINE, []).policy.cfg.cap_tokens == 4096 // 8
    monkeypatch.setenv("FAIRSHARE_PER_REQUEST_CAP_TOKENS", "300")
    Harness(SEED_ENGINE, [])
    assert "Prefill cap set explicitly: long_prefill_token_threshold=300" in caplog.messages


def test_an_empty_variable_is_unset_as_in_policy_config(monkeypatch):
    """One rule for the plugin and `PolicyConfig`: an empty ``FAIRSHARE_*`` variable counts as not set."""
    monkeypatch.setenv("FAIRSHARE_MAX_RUNNING_REQUESTS", "")
    monkeypatch.setenv("FAIRSHARE_MIXED_DECODE", "")
    monkeypatch.setenv("fairshare_lookahead", "3")  # case-insensitive, as pydantic-settings reads it
    assert PolicyConfig().max_running_requests == 10 and PolicyConfig().lookahead == 3
    cfg = attach_policy(build_scheduler(SEED_ENGINE, patched=True)).cfg
    assert (cfg.max_running_requests, cfg.cap_tokens, cfg.lookahead) == (10, 409, 3)  # sglang's limit stands
    args = ServerArgs(model_path="dummy", device="cpu", chunked_prefill_size=512)
    apply_policy_env(args)  # raised on the empty string before
    monkeypatch.delenv("FAIRSHARE_MIXED_DECODE")
    unset = ServerArgs(model_path="dummy", device="cpu", chunked_prefill_size=512)
    apply_policy_env(unset)
    assert args.enable_mixed_chunk is unset.enable_mixed_chunk is PolicyConfig.model_fields["mixed_decode"].default


def test_scheduler_reports_the_policy_in_its_handshake_and_the_launcher_checks_it():
    sched = build_scheduler(SEED_ENGINE, patched=True)
    attach_policy(sched)
    info = {"status": "ready"}
    hooks.after_get_init_info(info, sched)
    assert info["fairshare"] == "active"
    loading.check_scheduler_infos([info])
    with pytest.raises(loading.PluginNotLoadedError, match=r"scheduler process\(es\) \[1\] of 2.*setup_ray_worker"):
        loading.check_scheduler_infos([info, {"status": "ready"}])  # a Ray actor that never loaded plugins


def test_small_sglang_chunk_clamps_the_interactive_pass():
    cfg = policy_config_for(build_scheduler(EngineSpec(chunk_tokens=256), patched=True))
    assert (cfg.chunk_budget_tokens, cfg.interactive_pass_tokens) == (256, 256)


def test_a_chunk_smaller_than_the_documents_floor_clamps_the_floor():
    # sglang's chunk below the default floor (128): the scheduler process must still start, its floor the chunk.
    cfg = policy_config_for(build_scheduler(EngineSpec(chunk_tokens=64), patched=True))
    assert (cfg.chunk_budget_tokens, cfg.long_pass_floor_tokens) == (64, 64)


def test_bad_switch_fails_at_start_naming_it(monkeypatch):
    monkeypatch.setenv("FAIRSHARE_LOOKAHEAD", "-1")
    with pytest.raises(ValueError, match="lookahead"):
        attach_policy(build_scheduler(SEED_ENGINE, patched=True))


def test_mixed_decode_and_interval_are_sglangs_resolved_values(monkeypatch, caplog):
    sched = build_scheduler(SEED_ENGINE, patched=True)
    sched.is_mixed_chunk, sched.prefill_decode_interval = True, 2
    cfg = policy_config_for(sched)
    assert (cfg.mixed_decode, cfg.decode_steps_per_prefill) == (True, 2)
    # sglang resolved mixed chunk off (speculative decoding does): the policy follows sglang and says so.
    monkeypatch.setenv("FAIRSHARE_MIXED_DECODE", "true")
    sched.is_mixed_chunk = False
    attach_policy(sched)
    assert policy_of(sched).cfg.mixed_decode is False
    assert any("sglang resolved enable_mixed_chunk to False" in m for m in caplog.messages)


def test_switches_map_onto_sglangs_server_args(monkeypatch):
    args = ServerArgs(model_path="dummy", device="cpu", chunked_prefill_size=512)
    apply_policy_env(args)
    # Unset: the interval is sglang's; mixed chunk gets the policy's default (on), and false turns it off.
    assert (args.enable_mixed_chunk, args.prefill_decode_interval) == (True, None)
    monkeypatch.setenv("FAIRSHARE_MIXED_DECODE", "false")
    apply_policy_env(args)
    assert args.enable_mixed_chunk is False
    monkeypatch.setenv("FAIRSHARE_MIXED_DECODE", "true")
    monkeypatch.setenv("FAIRSHARE_DECODE_STEPS_PER_PREFILL", "3")
    apply_policy_env(args)
    assert (args.enable_mixed_chunk, args.prefill_decode_interval) == (True, 3)
    args.resolve_once()
    view = resolving_view(args)
    assert (view.enable_mixed_chunk, view.prefill_decode_interval) == (True, 3)
    monkeypatch.setenv("FAIRSHARE_DECODE_STEPS_PER_PREFILL", "5")
    apply_policy_env(args)  # a resolved record (e.g. pickled into the scheduler process) is left alone
    assert args.prefill_decode_interval == 3


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_overlap_off_on_cpu_only_when_the_policy_says_so(monkeypatch, device):
    def disabled(policy: str | None) -> bool:
        if policy is None:
            monkeypatch.delenv("FAIRSHARE_CPU_OVERLAP_SCHEDULE", raising=False)
        else:
            monkeypatch.setenv("FAIRSHARE_CPU_OVERLAP_SCHEDULE", policy)
        args = ServerArgs(model_path="dummy", device=device, chunked_prefill_size=512)
        apply_policy_env(args)
        return args.disable_overlap_schedule

    # Unset or true: sglang's own choice; false: its normal loop, on a CPU only.
    assert (disabled(None), disabled("true"), disabled("false")) == (False, False, device == "cpu")


def test_chunking_off_keeps_skip_ahead_and_drops_caps():
    engine = EngineSpec(pool_tokens=4096, chunk_tokens=None, max_prefill_tokens=16384)
    reqs = [
        ReqSpec("holder", 2000, decode_passes=50),
        ReqSpec("big", 2500, arrive_pass=1),
        ReqSpec("small", 30, arrive_pass=1),
    ]
    plugin = Harness(engine, reqs)
    cfg = plugin.policy.cfg
    assert (cfg.fair_share, cfg.adaptive_pass, cfg.chunk_budget_tokens) == (False, False, 16384)
    plugin.run(2)
    assert [r.admitted for r in plugin.history] == [[("holder", 2000)], [("small", 30)]]


def test_upstream_rules_apply_where_the_policy_cannot_hold(caplog):
    sched = build_scheduler(SEED_ENGINE, patched=True)
    sched.dllm_config = True
    policy = attach_policy(sched)
    assert policy.inactive_reason is not None
    assert hooks.around_get_prefill_adder_class(UPSTREAM_ADDER_CLASS, sched) is PrefillAdder
    assert any("upstream sglang scheduling applies" in m for m in caplog.messages)


def test_priority_preemption_leaves_to_upstream_only_the_passes_where_it_may_act(caplog):
    """sglang turns preemption on by default under priority scheduling: the policy still runs every pass in
    which the waiting requests fit the free running slots; a pass where upstream may preempt is upstream's."""
    engine = dataclasses.replace(SEED_ENGINE, max_running=2, priority_scheduling=True)
    reqs = [
        ReqSpec("doc", 6000, decode_passes=50),
        ReqSpec("q", 30, arrive_pass=1, decode_passes=50),
        ReqSpec("x1", 30, arrive_pass=2),
        ReqSpec("x2", 30, arrive_pass=2),
    ]
    plugin = Harness(engine, reqs)
    plugin.sched.enable_priority_preemption = True
    assert plugin.policy.inactive_reason is None
    assert plugin.step().admitted == [("doc", 6000)]
    assert plugin.step().admitted == [("q", 30)]  # one free slot, one waiting: the policy plans
    assert plugin.policy.num_planned_passes == 2
    assert plugin.step().admitted == []  # no free slot, two waiting: upstream's pass (it may preempt)
    assert plugin.policy.num_planned_passes == 2
    assert any("priority preemption may act" in m for m in caplog.messages)


def test_hicache_storage_passes_run_upstreams_rules(caplog):
    plugin = Harness(SEED_ENGINE, [ReqSpec("a", 10)])
    plugin.sched.enable_hicache_storage = True  # sglang can attach storage while serving
    assert plugin.policy.start_pass(plugin.sched) is None
    assert plugin.policy.start_pass(plugin.sched) is None
    assert sum("hierarchical-cache storage" in m for m in caplog.messages) == 1
    plugin.sched.enable_hicache_storage = False
    assert plugin.policy.start_pass(plugin.sched) is not None


def test_a_target_left_unpatched_makes_the_plugin_inert(monkeypatch, caplog):
    monkeypatch.setattr(HookRegistry, "_patched", {spec.target for spec in hooks.TARGETS[:-1]})
    sched = build_scheduler(SEED_ENGINE, patched=True)
    hooks.after_scheduler_init(None, sched)
    assert policy_of(sched).inactive_reason.startswith("hook targets not patched: sglang.srt.server_args")
    assert any(r.levelno == logging.ERROR and "patches nothing" in r.getMessage() for r in caplog.records)
    assert policy_of(sched).start_pass(sched) is None


def test_diagnostics_lines_in_the_seeds_form(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="fairshare")
    monkeypatch.setenv("FAIRSHARE_DIAGNOSTICS", "true")
    reqs = [
        ReqSpec("holder", 2000, decode_passes=50),
        ReqSpec("big", 2500, arrive_pass=1),
        ReqSpec("small", 30, arrive_pass=1),
    ]
    Harness(EngineSpec(pool_tokens=4096, chunk_tokens=2048), reqs).run(2)
    lines = [r.getMessage() for r in caplog.records if r.name == "fairshare.scheduler"]
    rejection = next(line for line in lines if line.startswith("res=NO_TOKEN"))
    # sglang's own figure: the whole prompt (2,500), the output reservation (32) and one page of overhead.
    assert rejection.startswith("res=NO_TOKEN need=2533 rem_total=")
    assert rejection.endswith("chunked=0/1 can_run=0 skip rid=big")
    assert any(line.startswith("budget pass=") and "small:30" in line for line in lines)


def test_diagnostics_off_by_default(caplog):
    caplog.set_level(logging.INFO, logger="fairshare")
    reqs = [ReqSpec("holder", 2000, decode_passes=50), ReqSpec("big", 2500, arrive_pass=1)]
    Harness(EngineSpec(pool_tokens=4096, chunk_tokens=2048), reqs).run(2)
    assert not any(m.startswith(("res=", "budget ")) for m in caplog.messages)


@pytest.fixture
def fresh_registry(monkeypatch):
    """`load()` only registers hooks (sglang applies them); keep its registrations out of the process."""
    monkeypatch.setattr(HookRegistry, "_hooks", defaultdict(list))
    monkeypatch.setattr(loading, "_registered", False)
    return HookRegistry._hooks


def test_pass_trace_one_line_per_planned_pass(monkeypatch, tmp_path):
    trace = tmp_path / "passes.jsonl"
    monkeypatch.setenv("FAIRSHARE_PASS_TRACE", str(trace))
    reqs = [
        ReqSpec("holder", 2000, decode_passes=50),
        ReqSpec("big", 2500, arrive_pass=1),
        ReqSpec("small", 30, arrive_pass=1),
    ]
    plugin = Harness(EngineSpec(pool_tokens=4096, chunk_tokens=2048), reqs)
    plugin.run(3)
    records = read_pass_trace(trace)
    assert len(records) == plugin.policy.num_planned_passes >= 2
    assert [r["admitted"] for r in records[:2]] == [[["holder", 2000]], [["small", 30]]]
    second = records[1]
    assert [j[0] for j in second["judged"]] == ["big", "small"] and second["num_waiting"] == 2
    assert second["rejections"] == [["big", 2533, second["free_kv_tokens"], True]]  # sglang's own need
    assert second["grants"] == [["small", 30, False]] and second["decode_rows"] == 0


def test_pass_trace_off_formats_nothing(monkeypatch):
    monkeypatch.setattr(attach_mod, "pass_record", None)  # would raise if called
    Harness(SEED_ENGINE, [ReqSpec("a", 100)]).run(2)


def test_version_guard_patches_nothing_on_another_sglang(monkeypatch, fresh_registry, caplog):
    monkeypatch.setattr(loading, "installed_sglang_version", lambda: "0.5.24")
    loading.load()
    assert dict(fresh_registry) == {}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "sglang 0.5.24 is not the tested 0.5.23" in errors[0]


def test_version_guard_can_be_forced(monkeypatch, fresh_registry):
    monkeypatch.setattr(loading, "installed_sglang_version", lambda: "0.5.24")
    monkeypatch.setenv("FAIRSHARE_PLUGIN_FORCE", "1")
    loading.load()
    assert set(fresh_registry) == {spec.target for spec in hooks.TARGETS}


def test_plugin_can_be_switched_off(monkeypatch, fresh_registry):
    monkeypatch.setenv("FAIRSHARE_PLUGIN_ENABLED", "0")
    loading.load()
    assert dict(fresh_registry) == {}


def test_switched_off_with_the_clock_on_only_upstreams_call_is_timed(monkeypatch, fresh_registry, tmp_path):
    monkeypatch.setenv("FAIRSHARE_PLUGIN_ENABLED", "0")
    monkeypatch.setenv("FAIRSHARE_PLUGIN_CLOCK", str(tmp_path / "clock.jsonl"))
    loading.load()
    (target,) = fresh_registry
    assert [spec.target for spec in hooks.UPSTREAM_CLOCK_TARGETS] == [target]
    assert target.endswith("Scheduler._get_new_batch_prefill_raw")


def test_switched_off_with_the_trace_on_upstreams_decisions_are_traced(monkeypatch, fresh_registry, tmp_path):
    monkeypatch.setenv("FAIRSHARE_PLUGIN_ENABLED", "0")
    monkeypatch.setenv("FAIRSHARE_PASS_TRACE", str(tmp_path / "passes.jsonl"))
    loading.load()
    assert {t: len(h) for t, h in fresh_registry.items()} == {spec.target: 1 for spec in hooks.UPSTREAM_TRACE_TARGETS}


def test_an_unresolved_target_patches_nothing(monkeypatch, fresh_registry, caplog):
    bogus = hooks.HookSpec("sglang.srt.managers.scheduler.Scheduler.no_such_method", *hooks.TARGETS[0][1:])
    monkeypatch.setattr(hooks, "TARGETS", (*hooks.TARGETS, bogus))
    loading.load()
    assert dict(fresh_registry) == {}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "Scheduler.no_such_method" in errors[0]


def test_load_registers_every_target_once(fresh_registry):
    loading.load()
    loading.load()
    assert {t: len(h) for t, h in fresh_registry.items()} == {spec.target: 1 for spec in hooks.TARGETS}


def test_under_tensor_parallelism_the_pass_cost_fit_stays_off(caplog):
    """Each rank times its own passes: a fit per rank would plan different passes on different ranks."""
    single = attach_policy(build_scheduler(SEED_ENGINE, patched=True))
    assert single.pass_cost.frozen_reason is None and single.timer is not None
    sched = build_scheduler(SEED_ENGINE, patched=True)
    sched.tp_size = 2
    fit = attach_policy(sched).pass_cost
    assert fit.frozen_reason.startswith("tp_size=2")
    for _ in range(200):
        fit.observe(512, 131_328.0, 4, 4000, 0.01)
    assert fit.model is fit.prior and fit.num_fits == 0 and fit.num_observed == 200
    assert math.isnan(fit.pass_s(512, 131_328.0, 4, 4000))  # no prediction: the static knobs on every rank
    assert any("the pass-cost fit is off (tp_size=2" in m for m in caplog.messages)
