"""The policy attached to one sglang `Scheduler`: its config, its start-up log, one planner across passes.

The config is `PolicyConfig` from the ``FAIRSHARE_*`` environment, the simulator's variables, with the
engine's own values where the environment is silent: ``max_running_requests`` (so F follows sglang's
concurrency limit, the article's rule) and ``chunk_budget_tokens`` (sglang's ``chunked_prefill_size``), by
`policy.plugin_policy`, the rules a launcher predicts the same policy with from its server arguments.
Mixed decode and the decode interval are always what sglang resolved: their ``FAIRSHARE_*`` switches were
written onto sglang's server arguments at launch (`server_args`), and the policy follows sglang's outcome
(a warning says when sglang overrode the switch).

Where the policy cannot hold, sglang keeps its own rules: skip-ahead is off under priority scheduling
(it would overtake by arrival, not priority); a pass in which priority preemption may act (sglang's default
under priority scheduling: the waiting requests outnumber the free running slots) runs upstream's rules,
since upstream preempts for the request after a full batch, which the planner does not model; the plugin
steps aside entirely for dLLM (its own adder), and for hierarchical-cache storage or LMCache prefetch (the
scan stages prefetches that must not be matched early). With chunking off there is nothing to cap: shares
and pass sizing are off.

The scheduler reports the policy's state in its start-up handshake (`init_info`), so the launcher can
tell a scheduler that never loaded the plugin (sglang's Ray launcher does not call `load_plugins()`), and live in
sglang's internal state (``/server_info``, ``Engine.get_server_info``): the policy as this scheduler filled it (a
launcher reads it back: sglang computes some of its values only as it starts), the wait bound routers predict a chat's
wait with, the online pass-cost fit and the last pass.

Every pass the engine runs is timed where its result lands (`pass_timer`) and fitted online
(`scheduler.pass_cost_fit`): the planner sizes passes from that fit. Under tensor or pipeline parallelism each rank
runs its own scheduler and times its own passes, and the ranks' timings differ, so their fits would too, and with
them the pass sizes they plan: the ranks would run different batches. There the fit is frozen: it never fits, so
it predicts nothing and every rank sizes passes with the static knobs, the same on each (`fit_frozen_reason`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from sglang.srt.managers.schedule_policy import CacheAgnosticPolicy
from sglang.srt.runtime_context import get_parallel

from scheduler.config import PolicyConfig, env_var_name
from scheduler.diagnostics import log_pass_cost, pass_cost_line
from scheduler.interleave import DecodeInterleave, short_decode_passes
from scheduler.pass_cost import AttentionWork
from scheduler.pass_cost_fit import FitSettings, OnlinePassCost
from scheduler.pass_trace import ArrivalLog, PassTraceWriter, pass_record, timing_record
from scheduler.planner import PassPlanner
from scheduler.sglang_plugin.adder import PassRun
from scheduler.sglang_plugin.clock import PassKind, PluginClock
from scheduler.sglang_plugin.env import (
    explicit_policy_fields,
    explicit_policy_value,
    pass_trace_path,
    plugin_clock_path,
)
from scheduler.sglang_plugin.idle_scan import IdleScan
from scheduler.sglang_plugin.pass_timer import Launch, PassTimer
from scheduler.sglang_plugin.policy import policy_config_for as policy_config_for  # tests import it from here
from scheduler.sglang_plugin.server_args import POLICY_FIELD_TO_SERVER_ARG
from scheduler.sglang_plugin.short_index import ShortIndex
from scheduler.sglang_plugin.tenant_keys import QueueTenants, decoded_rows, queue_in_arrival_order
from scheduler.sglang_plugin.translate import (
    admission_lag_passes,
    finishing_rids,
    launch_is_synchronous,
    mixed_decode_rows,
    output_lag_passes,
)
from scheduler.slo_sizing import arrival_wait_s
from scheduler.snapshot import PassPlan

logger = logging.getLogger("fairshare.sglang_plugin")
T = TypeVar("T")

POLICY_ATTR = "_fairshare_policy"
INIT_INFO_KEY = "fairshare"
"""Key of the policy's state in the scheduler's start-up handshake: ``active`` or ``inactive: <reason>``."""
SMALL_CAP_TOKENS = 128
"""Below this F, contended passes prefill in slivers: worth a warning at start."""

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler


def fit_frozen_reason(sched: Scheduler) -> str | None:
    """Why this scheduler's pass-cost fit must stay off (every rank must plan the same passes), or None."""
    tp_size, pp_size = int(getattr(sched, "tp_size", 1) or 1), int(get_parallel().pp_size or 1)
    if tp_size > 1 or pp_size > 1:
        return f"tp_size={tp_size} pp_size={pp_size}: each rank times its own passes; a fit would differ by rank"
    return None


def attention_work(sched: Scheduler) -> AttentionWork:
    """What the prefill attention backend this engine runs computes for a chunk (`AttentionWork`), read from the
    backend object, not its name: sglang's own ``torch_native`` extend pads every request to its whole sequence;
    every other extend (FlashInfer, FlashAttention, triton, a ``torch_native`` whose extend a plugin replaced)
    attends from the chunk's queries."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    backend = getattr(getattr(getattr(sched, "tp_worker", None), "model_runner", None), "attn_backend", None)
    prefill = getattr(backend, "prefill_backend", backend)  # HybridAttnBackend: prefill and decode backends differ
    extend = getattr(type(prefill), "_run_sdpa_forward_extend", None)
    padded = extend is TorchNativeAttnBackend._run_sdpa_forward_extend
    return AttentionWork.PADDED_CAUSAL if padded else AttentionWork.QUERIES


def inactive_reason(sched: Scheduler) -> str | None:
    """Why the plugin leaves this scheduler to upstream entirely (checked at start)."""
    if sched.dllm_config is not None:
        return "dLLM scheduling has its own adder"
    return None


def pass_exclusion(sched: Scheduler, running_batch: ScheduleBatch | None) -> str | None:
    """Why this pass runs upstream's rules (these settings can change while serving)."""
    if sched.enable_hicache_storage or sched.enable_lmcache:
        return "hierarchical-cache storage / LMCache prefetch is on"
    if sched.enable_priority_preemption and preemption_possible(sched, running_batch):
        return "priority preemption may act (more waiting requests than free running slots)"
    return None


def preemption_possible(sched: Scheduler, running_batch: ScheduleBatch | None) -> bool:
    """Upstream's scan preempts only once the batch is full: when the waiting requests outnumber the free
    running slots. Other passes admit within the free slots and run the policy."""
    running_batch = sched.running_batch if running_batch is None else running_batch
    free = sched.get_num_allocatable_reqs(len(running_batch.reqs), running_batch=running_batch)
    return len(sched.waiting_queue) > free - (sched.chunked_req is not None)


@dataclass
class SchedulerPolicy:
    planner: PassPlanner
    inactive_reason: str | None = None
    last_run: PassRun | None = None
    """The last pass planned (its snapshot and plan), for inspection; idle passes that repeat it keep it."""
    trace: PassTraceWriter | None = None
    clock: PluginClock | None = None
    pass_cost: OnlinePassCost = field(default_factory=OnlinePassCost)
    """The pass-cost model the planner sizes passes from, fitted online from `timer`'s passes."""
    timer: PassTimer | None = None
    """Times every pass the engine runs (None while the policy is inactive)."""
    num_planned_passes: int = 0
    interleave: DecodeInterleave = field(default_factory=DecodeInterleave)
    """Decode-only passes owed to short streams when sglang's mixed chunk is off (sglang's own
    prefill-decode interval, when set, does this for every stream instead)."""
    reuse_idle_scans: bool = True
    """Off: every pass matches the waiting requests and plans afresh (to compare decisions and cost)."""
    num_reused_scans: int = 0
    """Planned passes that planned on the last idle scan's figures (`idle_scan`) instead of matching again."""
    short_index: ShortIndex = field(default_factory=ShortIndex)
    """The short waiting requests, so one queued past the lookahead is still found (issue 8)."""
    queue_tenants: QueueTenants = field(default_factory=QueueTenants)
    """The tenants of the waiting queue, kept as requests join it (`tenant_keys`)."""
    arrivals: ArrivalLog = field(default_factory=ArrivalLog)
    """With the pass trace on: which waiting requests each traced pass sees for the first time."""
    admission_lag_passes: int = 0
    output_lag_passes: int = 0
    """The engine's lags (`translate`), fixed for its life: for the wait bound published to routers (`describe`)."""
    _queue_at_begin: list[str] = field(default_factory=list)
    _finishing_at_begin: list[str] = field(default_factory=list)
    _run: PassRun | None = None
    _running_batch: ScheduleBatch | None = None
    _idle_scan: IdleScan | None = None
    _warned: set[str] = field(default_factory=set)

    @property
    def cfg(self) -> PolicyConfig:
        return self.planner.cfg

    def begin_pass(self, sched: Scheduler, running_batch: ScheduleBatch | None) -> None:
        """The pass boundary (`_get_new_batch_prefill_raw`), before sglang builds the adder."""
        self._running_batch = running_batch
        if self.clock is not None:
            self.clock.begin_call()
        if self.trace is not None:
            self._queue_at_begin = [r.rid for r in sched.waiting_queue]
            self._finishing_at_begin = finishing_rids(sched, running_batch)
        if self.inactive_reason is None and self.cfg.skip_ahead:
            self._timed(self._refresh_short_index, sched)

    def unplanned_pass(self, original: Callable[..., T], sched: Scheduler, *args: Any, **kwargs: Any) -> T:
        """A pass that `hooks.nothing_to_plan` finds nothing to plan in: upstream's call as is. Of the pass boundary
        (`begin_pass` ... `end_pass`) only what outlives the pass is done: the short index's refresh (an emptied
        queue resets it). Every other step would find nothing to do (no idle scan holds an empty queue, no adder is
        built), so the pass costs the plugin about what upstream's own check costs. The clock records it as a pass
        not planned, as `end_pass` would."""
        if self.clock is not None:
            self.clock.begin_call()
        if self.inactive_reason is None and self.cfg.skip_ahead and (sched.waiting_queue or self.short_index.reqs):
            self._timed(self._refresh_short_index, sched)  # an empty queue leaves an empty index as it is
        if self.planner.tenants.backlogged:
            self.planner.tenants.observe(())  # nobody waits: as `PassPlanner.plan` would observe (no decode charge)
        try:
            return original(sched, *args, **kwargs)
        finally:
            if self.clock is not None:
                self.clock.end_pass(PassKind.NONE)

    def _refresh_short_index(self, sched: Scheduler) -> None:
        self.short_index.refresh(sched.waiting_queue, self.cfg, queue_in_arrival_order(sched))

    def _timed(self, section: Callable[..., T], *args: Any) -> T:
        """`section` timed by the plugin clock when it is on (`clock`); nothing is read when it is off."""
        return section(*args) if self.clock is None else self.clock.timed(section, *args)

    def outside(self, section: Callable[..., T], *args: Any) -> T:
        """`section`, the plugin's work in the scheduler loop outside `_get_new_batch_prefill_raw` (where a pass's
        launch returns and where its result lands), timed as such by the plugin clock when it is on."""
        return section(*args) if self.clock is None else self.clock.timed_outside(section, *args)

    def idle_pass(self, sched: Scheduler, running_batch: ScheduleBatch) -> bool:
        """True when this pass can admit nobody and is planned already, on the last idle scan, without sglang
        building an adder: `_get_new_batch_prefill_raw` then returns at once, as upstream's does while
        ``batch_is_full`` (`idle_scan`). Only where the rest of that call would change nothing: no continuing
        chunk, no grammar ready, no preemption, FCFS order (no queue reordering), free slots left."""
        return self._timed(self._idle_pass, sched, running_batch)

    def _idle_pass(self, sched: Scheduler, running_batch: ScheduleBatch) -> bool:
        scan = self._idle_scan
        if (
            scan is None
            or not self.reuse_idle_scans
            or self.inactive_reason is not None
            or sched.chunked_req is not None
            or running_batch.batch_is_full
            or sched.enable_priority_preemption
            or sched.is_hybrid_swa
            or sched.policy.policy is not CacheAgnosticPolicy.FCFS
            or sched.enable_hicache_storage  # `pass_exclusion`, without preemption (above)
            or sched.enable_lmcache
            or sched.grammar_manager.has_waiting_grammars()
        ):
            return False
        figures = scan.figures_without_adder(sched, running_batch, self.cfg)
        if figures is None:
            return False
        free_kv, engine = figures
        if engine[0] <= 0 or not scan.holds(sched, self.cfg, free_kv, engine):
            return False
        if self._repeats_last_run(scan, sched.forward_ct, engine[1], engine[2]):
            self._run = self.last_run
            return True
        self.fit_current()  # the plan may size the pass from it
        self._run = self._pass_run(sched, scan)
        self._run.plan_without_adder(scan.state_of(sched, free_kv, engine))
        return True

    def _repeats_last_run(self, scan: IdleScan, pass_index: int, num_decoding: int, num_short: int) -> bool:
        """The last pass planned was planned on `scan` too, without an adder, and its plan holds for this pass
        (`PassPlanner.repeat_idle`): it stands as this pass's (`last_run` keeps its first pass's snapshot). Not
        when the pass trace is on: its records carry each pass's own figures."""
        last = self.last_run
        return (
            last is not None
            and last.window is scan
            and last.adder is None
            and self.trace is None
            and self.planner.repeat_idle(last.plan, pass_index, num_decoding, num_short)
        )

    def start_pass(self, sched: Scheduler) -> PassRun | None:
        """A new pass to plan, or None when upstream's rules apply to it."""
        return self._timed(self._start_pass, sched)

    def _start_pass(self, sched: Scheduler) -> PassRun | None:
        self._run = None
        reason = self.inactive_reason or pass_exclusion(sched, self._running_batch)
        if reason is not None:
            if reason not in self._warned:
                self._warned.add(reason)
                logger.warning("fairshare: %s; upstream sglang scheduling applies", reason)
            self._idle_scan = None
            return None
        last = self._idle_scan if self.reuse_idle_scans else None
        self.fit_current()  # the plan may size the pass from it
        self._run = self._pass_run(sched, last)
        return self._run

    def _pass_run(self, sched: Scheduler, last_idle_scan: IdleScan | None) -> PassRun:
        traced = self.trace is not None
        return PassRun(sched, self.planner, last_idle_scan, self.clock, self.short_index, traced, self.queue_tenants)

    @property
    def status(self) -> str:
        return "active" if self.inactive_reason is None else f"inactive: {self.inactive_reason}"

    def decode_due(self, running_batch: ScheduleBatch | None) -> bool:
        """Should this iteration run decode only (no prefill batch), for the short streams' sake?"""
        if self.inactive_reason is not None or running_batch is None:
            return False
        return self.interleave.decode_due(len(running_batch.reqs))

    def charge_decode(self, batch: ScheduleBatch) -> None:
        """Bill the tenants of the requests that decoded in `batch` (`PassPlanner.charge_decode`): called for every
        pass the engine runs while two tenants or more are backlogged, the only time the charge counts."""
        self.planner.charge_decode(decoded_rows(batch))

    def end_pass(self, batch: ScheduleBatch | None = None) -> None:
        """The pass boundary's end (after upstream's scan), called whether or not sglang built an adder. `batch`:
        the prefill batch sglang built, if any."""
        kind = self._timed(self._end_pass, batch)
        if self.clock is not None:
            self.clock.end_pass(kind)

    def _end_pass(self, batch: ScheduleBatch | None) -> PassKind:
        run, self._run, self._running_batch = self._run, None, None
        if run is not None:  # else sglang returned before planning: the last idle scan may still hold
            self._idle_scan = run.idle_scan
        if run is not None and run.plan is not None:
            self.num_reused_scans += run.reused_scan
            if run.adder is not None:
                run.finish()
            self.last_run = run
            if self.trace is not None:
                self.trace.write(self._record(run, batch))  # numbered from 0, as the simulator's (sim_vs_sglang)
            self.num_planned_passes += 1
            if run.plan.grants and not self.cfg.decode_steps_per_prefill:
                self.interleave.after_prefill(short_decode_passes(self.cfg, run.snapshot.num_short_decoding))
        ledger = self.planner.ledger
        if run is not None and len(ledger.first_skipped) > ledger.max_entries:
            ledger.prune({r.rid for r in run.sched.waiting_queue})  # drop requests aborted while waiting
        if run is None or run.plan is None:
            return PassKind.NONE
        if not run.reused_scan:
            return PassKind.SCAN
        return PassKind.REPLAY if run.adder is not None else PassKind.IDLE

    def pass_landed(self, launched_s: float | None, figures: Launch | None, landed_s: float, forward_pass: int) -> None:
        """A pass's result was processed (`pass_timer`): time it, fit it, trace it. Unless the trace or the
        diagnostics read each pass's fit, the fit takes the pass later (`PassTimer.landed_later`): before anything
        reads it (`fit_current`), so every read sees the fit it would have seen."""
        assert self.timer is not None
        if self.trace is None and not self.cfg.diagnostics:
            self.timer.landed_later(launched_s, figures, landed_s, forward_pass)
            return
        fits = self.pass_cost.num_fits
        timed = self.timer.landed(launched_s, figures, landed_s, forward_pass)
        if timed is None:
            return
        if self.trace is not None:
            f = timed.figures
            self.trace.write(
                timing_record(
                    timed.forward_pass,
                    f.prefill_tokens,
                    f.prefill_ctx_pairs,
                    f.decode_rows,
                    f.decode_ctx_tokens,
                    timed.measured_s,
                    timed.predicted_s,
                )
            )
        if self.pass_cost.num_fits != fits:
            log_pass_cost(self.cfg, self.pass_cost.describe())

    def fit_current(self) -> OnlinePassCost:
        """The pass-cost fit, fed every pass that has landed."""
        if self.timer is not None:
            self.timer.catch_up()
        return self.pass_cost

    def wait_pass_s(self) -> float:
        """The longest pass a chat arriving now may wait for, in seconds, as this engine's sizer bounds it
        (`scheduler.slo_sizing.arrival_wait_s` on the online fit; 0 while the fit cannot predict)."""
        own_s = self.planner.sizer.slo.arrival_own_pass_s(self.fit_current())
        return arrival_wait_s(self.cfg, own_s, self.admission_lag_passes, self.output_lag_passes)

    def describe(self) -> dict[str, Any]:
        """The policy's live state (sglang's internal state: ``/server_info``): the policy it runs (its values as this
        scheduler filled them, which a launcher reads back), the targets, the wait bound routers predict a chat's
        wait with, the passes sglang's event loop puts before a chat's admission and after its own pass (`translate`:
        its overlap loop's), the pass-cost fit, the last pass planned (its size, what set it, the seconds allowed
        and predicted) and the passes the targets could not size as asked."""
        fit = self.fit_current()
        last = self.last_run.plan if self.last_run is not None else None
        counters = self.planner.slo_counters
        return {
            "status": self.status,
            "policy": self.cfg.model_dump(),
            "targets": {"ttft_target_s": self.cfg.ttft_target_s, "tbt_target_s": self.cfg.tbt_target_s},
            "wait_pass_s": self.wait_pass_s(),
            "admission_lag_passes": self.admission_lag_passes,
            "output_lag_passes": self.output_lag_passes,
            "pass_cost": fit.describe(),
            "timed_passes": self.timer.num_timed if self.timer is not None else 0,
            "planned_passes": self.num_planned_passes,
            "last_pass": None if last is None else last_pass(last),
            "sized_passes": counters.sized_passes,
            "missed_passes": {target.value: n for target, n in counters.missed_passes.items()},
            "slot_passes": counters.slot_passes,
            "unusable_cost_passes": counters.unusable_cost_passes,
        }

    def _record(self, run: PassRun, batch: ScheduleBatch | None) -> dict[str, Any]:
        admitted = [(r.rid, int(r.extend_len)) for r in run.adder.can_run_list] if run.adder is not None else []
        judged = run.window.candidates
        shorts = run.judged_shorts()
        arrived = self.arrivals.arrived(self._queue_at_begin)
        return pass_record(
            self.num_planned_passes,
            run.snapshot,
            [*judged, *shorts],
            run.plan,
            admitted,
            mixed_decode_rows(batch),
            arrived,
            self._finishing_at_begin,
            pass_cost=self.pass_cost.describe(),
        )


def last_pass(plan: PassPlan) -> dict[str, Any]:
    return {
        "pass_budget_tokens": plan.pass_budget_tokens,
        "sized_by": plan.sized_by,
        "pass_bound_s": plan.pass_bound_s,
        "predicted_pass_s": plan.predicted_pass_s,
        "prefill_tokens": plan.num_prefill_tokens,
    }


def attach_policy(sched: Scheduler, missing_targets: list[str] | tuple[str, ...] = ()) -> SchedulerPolicy:
    """Create the scheduler's policy and log it (F first, in the article's wording); called once, at the end
    of `Scheduler.__init__`."""
    if logging.getLogger("fairshare").level == logging.NOTSET:
        # sglang.Engine defaults to log_level=error; the start-up line and opted-in diagnostics still show.
        logging.getLogger("fairshare").setLevel(logging.INFO)
    cfg = policy_config_for(sched)
    reason = inactive_reason(sched)
    if missing_targets:
        reason = f"hook targets not patched: {', '.join(missing_targets)}"
        logger.error("fairshare: %s; the plugin patches nothing and sglang runs unpatched", reason)
    fit = OnlinePassCost(
        settings=FitSettings(overrun_quantile=cfg.pass_overrun_quantile),
        frozen_reason=fit_frozen_reason(sched),
        attention=attention_work(sched),
    )
    policy = SchedulerPolicy(
        PassPlanner(cfg, pass_cost=fit),
        inactive_reason=reason,
        pass_cost=fit,
        admission_lag_passes=admission_lag_passes(sched),
        output_lag_passes=output_lag_passes(sched),
    )
    if reason is None:
        policy.timer = PassTimer(fit, synchronous_launch=launch_is_synchronous(sched))
    trace_path = pass_trace_path()
    if trace_path is not None and reason is None:
        policy.trace = PassTraceWriter(trace_path, source=f"sglang-tp{getattr(sched, 'tp_rank', 0)}")
        logger.info("fairshare: pass trace -> %s", trace_path)
    if (path := plugin_clock_path()) is not None and reason is None:
        policy.clock = PluginClock(path)
        logger.info("fairshare: plugin time per pass -> %s", path)
    setattr(sched, POLICY_ATTR, policy)
    if reason is None:
        log_startup(cfg, sched)
        logger.info("fairshare: %s (fitted online from every pass the engine runs)", pass_cost_line(fit.describe()))
        if fit.frozen_reason is not None:
            logger.warning(
                "fairshare: the pass-cost fit is off (%s): the static pass knobs size every pass", fit.frozen_reason
            )
    elif not missing_targets:
        logger.warning("fairshare: %s; upstream sglang scheduling applies", reason)
    return policy


def policy_of(sched: Scheduler) -> SchedulerPolicy | None:
    policy: SchedulerPolicy | None = getattr(sched, POLICY_ATTR, None)
    return policy


def log_startup(cfg: PolicyConfig, sched: Scheduler) -> None:
    """The rest of the start-up log; `PassPlanner` itself logs F in the article's wording
    (``Prefill concurrency N=20: long_prefill_token_threshold=409``)."""
    explicit = explicit_policy_fields()
    source = {
        "max_running_requests": "FAIRSHARE_MAX_RUNNING_REQUESTS"
        if "max_running_requests" in explicit
        else "sglang max_running_requests",
        "chunk_budget_tokens": "FAIRSHARE_CHUNK_BUDGET_TOKENS"
        if "chunk_budget_tokens" in explicit
        else ("sglang chunked_prefill_size" if sched.chunked_prefill_size is not None else "sglang max_prefill_tokens"),
    }
    logger.info(
        "fairshare policy: skip_ahead=%s lookahead=%d max_skipped_passes=%d fair_share=%s full_budget_when_alone=%s "
        "adaptive_pass=%s slo_sizing=%s ttft_target_s=%g tbt_target_s=%g interactive_pass_tokens=%d "
        "quiet_pass_tokens=%s short_request_tokens=%d "
        "chunk_budget_tokens=%d (%s) max_running_requests=%d (%s) mixed_decode=%s decode_steps_per_prefill=%d "
        "(sglang enable_mixed_chunk / prefill_decode_interval) diagnostics=%s",
        cfg.skip_ahead,
        cfg.lookahead,
        cfg.max_skipped_passes,
        cfg.fair_share,
        cfg.full_budget_when_alone,
        cfg.adaptive_pass,
        cfg.slo_sizing,
        cfg.ttft_target_s,
        cfg.tbt_target_s,
        cfg.interactive_pass_tokens,
        cfg.quiet_pass_tokens,
        cfg.short_request_tokens,
        cfg.chunk_budget_tokens,
        source["chunk_budget_tokens"],
        cfg.max_running_requests,
        source["max_running_requests"],
        cfg.mixed_decode,
        cfg.decode_steps_per_prefill,
        cfg.diagnostics,
    )
    for policy_field, arg in POLICY_FIELD_TO_SERVER_ARG.items():
        wanted = explicit_policy_value(policy_field)
        if wanted is not None and wanted != getattr(cfg, policy_field):
            logger.warning(
                "fairshare: %s=%s, but sglang resolved %s to %s (it overrides the flag for this setup)",
                env_var_name(policy_field),
                wanted,
                arg,
                getattr(cfg, policy_field),
            )
    if sched.enable_priority_scheduling and "skip_ahead" in explicit and explicit_policy_value("skip_ahead"):
        logger.warning("fairshare: skip-ahead is off under priority scheduling")
    if sched.chunked_prefill_size is None:
        logger.warning("fairshare: chunked prefill is off in sglang; fair-share caps and pass sizing are off")
    elif cfg.chunk_budget_tokens > sched.chunked_prefill_size:
        logger.warning(
            "fairshare: chunk_budget_tokens=%d exceeds sglang's chunked_prefill_size=%d, which still bounds each pass",
            cfg.chunk_budget_tokens,
            sched.chunked_prefill_size,
        )
    granule = math.lcm(sched.page_size, sched.truncation_align_size or 1)
    if cfg.fair_share and cfg.cap_tokens < max(granule, SMALL_CAP_TOKENS):
        logger.warning(
            "fairshare: F=%d tokens (granule %d): contended passes prefill each request in slivers. "
            "F = chunk budget / (2 * max_running_requests); give sglang --max-running-requests (the article ran "
            "10: F=409) or set FAIRSHARE_PER_REQUEST_CAP_TOKENS",
            cfg.cap_tokens,
            granule,
        )
