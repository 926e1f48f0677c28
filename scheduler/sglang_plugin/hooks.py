"""The hook targets in sglang 0.5.23 and the hook functions; each hook is thin and delegates.

- ``Scheduler.__init__`` (AFTER): attach the policy (config from the scheduler's own values, one planner
  across passes) and log F in the article's wording; check that every target was patched, else stay inert.
- ``Scheduler.get_prefill_adder_class`` (AROUND): the intended extension point; wraps the adder class so
  it applies the pass plan.
- ``Scheduler._get_new_batch_prefill_raw`` (AROUND): the pass boundary; after upstream's scan, clean up
  the requests the plan matched and did not admit. With mixed chunk off it also returns no prefill batch when
  a decode-only pass is owed to short streams (as sglang's own prefill-decode interval defers prefill).
  Before it, a pass that can admit nobody (the last idle scan still holds) is planned at once and upstream's
  call returns nothing, as while ``batch_is_full``.
- ``Scheduler.run_batch`` (AROUND): when a pass's launch returned (on a device that runs a pass before its launch
  returns, the pass's end: `pass_timer`); while tenants share the engine, bill them the tokens the pass decodes.
- ``Scheduler.process_batch_result`` (AROUND): a pass's result lands; time the pass and feed the online pass-cost
  fit (`pass_timer`: where a pass starts and ends, under sglang's overlap scheduler too).
- ``Scheduler.get_init_info`` (AFTER): report the policy's state in the scheduler's start-up handshake.
- ``Scheduler.get_internal_state`` (AFTER): the policy's live state (the pass-cost fit, the last pass)
  in sglang's internal state, which ``/server_info`` and ``Engine.get_server_info`` return.
- ``Engine._launch_subprocesses`` (AFTER, launcher side; `RayEngine` and ``launch_server`` use it too):
  refuse a launch in which a scheduler reported no policy state (it never loaded the plugin).
- ``ServerArgs.resolve_once`` (BEFORE): map the mixed-decode and decode-interval switches onto sglang's
  own arguments. (`ServerArgs` is a msgspec Struct: a hook on ``__post_init__`` would never run.)

With the plugin off (``FAIRSHARE_PLUGIN_ENABLED=0``) but its clock on (``FAIRSHARE_PLUGIN_CLOCK``), only
`UPSTREAM_CLOCK_TARGETS` is patched: upstream's ``_get_new_batch_prefill_raw`` runs as is, timed, so a benchmark
compares the whole call with and without the plugin (`clock`). With the plugin off and the pass trace on
(``FAIRSHARE_PASS_TRACE``), `UPSTREAM_TRACE_TARGETS` record upstream's own decisions (`upstream_trace`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from scheduler.sglang_plugin.adder import adder_factory
from scheduler.sglang_plugin.attach import INIT_INFO_KEY, attach_policy, policy_of
from scheduler.sglang_plugin.clock import PassKind, PluginClock
from scheduler.sglang_plugin.env import plugin_clock_path
from scheduler.sglang_plugin.loading import check_scheduler_infos
from scheduler.sglang_plugin.pass_timer import launch_figures
from scheduler.sglang_plugin.server_args import apply_policy_env
from scheduler.sglang_plugin.upstream_trace import around_get_new_batch_prefill_raw as around_upstream_prefill_traced
from scheduler.sglang_plugin.upstream_trace import around_get_prefill_adder_class as around_upstream_adder_traced

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.server_args import ServerArgs

Original = Callable[..., Any]
"""The sglang method a hook wraps (`HookType.AROUND`), called with the same arguments."""


def after_scheduler_init(result: None, sched: Scheduler, *args: Any, **kwargs: Any) -> None:
    missing = [spec.target for spec in TARGETS if spec.target not in HookRegistry._patched]
    attach_policy(sched, missing_targets=missing)


def around_get_prefill_adder_class(original: Original, sched: Scheduler) -> Any:
    base = original(sched)
    policy = policy_of(sched)
    run = policy.start_pass(sched) if policy is not None else None
    return base if run is None else adder_factory(base, run)


def around_get_new_batch_prefill_raw(original: Original, sched: Scheduler, *args: Any, **kwargs: Any) -> Any:
    policy = policy_of(sched)
    if policy is None:
        return original(sched, *args, **kwargs)
    running_batch: ScheduleBatch = kwargs["running_batch"] if "running_batch" in kwargs else args[1]
    if policy.decode_due(running_batch):
        return None, running_batch  # no prefill this iteration: sglang runs the decode batch, as its interval does
    if nothing_to_plan(sched):
        return policy.unplanned_pass(original, sched, *args, **kwargs)
    policy.begin_pass(sched, running_batch)
    batch = None
    try:
        if policy.idle_pass(sched, running_batch):
            return None, running_batch  # nothing can be admitted: upstream's early return, as if batch_is_full
        batch, running_batch = original(sched, *args, **kwargs)
        return batch, running_batch
    finally:
        policy.end_pass(batch)


def nothing_to_plan(sched: Scheduler) -> bool:
    """Upstream's call will return before it builds an adder: no request waits, none is half-prefilled, no grammar
    is ready to join the queue (a lone stream decoding). The plugin then plans nothing either."""
    return not sched.waiting_queue and sched.chunked_req is None and not sched.grammar_manager.has_waiting_grammars()


def around_upstream_prefill_raw_clocked(original: Original, sched: Scheduler, *args: Any, **kwargs: Any) -> Any:
    """The plugin off, its clock on: upstream's call as is, timed (the clock opens its file at the first call, so
    only the scheduler process that makes them has one)."""
    clock = sched.__dict__.get(UPSTREAM_CLOCK_ATTR)
    if clock is None:
        clock = sched.__dict__[UPSTREAM_CLOCK_ATTR] = PluginClock(plugin_clock_path())
    clock.begin_call()
    try:
        return original(sched, *args, **kwargs)
    finally:
        clock.end_pass(PassKind.NONE)


def around_run_batch(original: Original, sched: Scheduler, batch: ScheduleBatch, *args: Any, **kwargs: Any) -> Any:
    result = original(sched, batch, *args, **kwargs)
    policy = policy_of(sched)
    if policy is not None and policy.timer is not None:
        policy.outside(policy.timer.run_returned, batch.forward_iter, time.monotonic())
    if policy is not None and len(policy.planner.tenants.backlogged) > 1:
        policy.outside(policy.charge_decode, batch)  # one tenant: the charge would change nothing (no adapter built)
    return result


def around_process_batch_result(
    original: Original, sched: Scheduler, batch: ScheduleBatch, *args: Any, **kwargs: Any
) -> Any:
    policy = policy_of(sched)
    if policy is None or policy.timer is None:
        return original(sched, batch, *args, **kwargs)
    # Read as launched: processing may change the batch.
    figures = policy.outside(launch_figures, batch, policy.pass_cost.attention) if sched.is_generation else None
    result = original(sched, batch, *args, **kwargs)
    policy.outside(policy.pass_landed, batch.launch_ts, figures, time.monotonic(), batch.forward_iter)
    return result


def after_get_internal_state(result: GetInternalStateReqOutput, sched: Scheduler, *args: Any, **kwargs: Any) -> None:
    policy = policy_of(sched)
    if policy is not None:
        result.internal_state[INIT_INFO_KEY] = policy.describe()


def after_get_init_info(result: dict[str, Any], sched: Scheduler) -> None:
    policy = policy_of(sched)
    result[INIT_INFO_KEY] = policy.status if policy is not None else "inactive: not attached"


def after_launch_subprocesses(result: Any, *args: Any, **kwargs: Any) -> None:
    init_result = next((r for r in result if hasattr(r, "scheduler_infos")), None) if result else None
    if init_result is not None and init_result.scheduler_infos:
        check_scheduler_infos(list(init_result.scheduler_infos))


def before_resolve_once(server_args: ServerArgs) -> None:
    apply_policy_env(server_args)


class HookSpec(NamedTuple):
    target: str
    hook_type: HookType
    hook: Callable[..., Any]


_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"

TARGETS: tuple[HookSpec, ...] = (
    HookSpec(f"{_SCHEDULER}.__init__", HookType.AFTER, after_scheduler_init),
    HookSpec(f"{_SCHEDULER}.get_prefill_adder_class", HookType.AROUND, around_get_prefill_adder_class),
    HookSpec(f"{_SCHEDULER}._get_new_batch_prefill_raw", HookType.AROUND, around_get_new_batch_prefill_raw),
    HookSpec(f"{_SCHEDULER}.run_batch", HookType.AROUND, around_run_batch),
    HookSpec(f"{_SCHEDULER}.process_batch_result", HookType.AROUND, around_process_batch_result),
    HookSpec(f"{_SCHEDULER}.get_init_info", HookType.AFTER, after_get_init_info),
    HookSpec(f"{_SCHEDULER}.get_internal_state", HookType.AFTER, after_get_internal_state),
    HookSpec("sglang.srt.entrypoints.engine.Engine._launch_subprocesses", HookType.AFTER, after_launch_subprocesses),
    HookSpec("sglang.srt.server_args.ServerArgs.resolve_once", HookType.BEFORE, before_resolve_once),
)

UPSTREAM_CLOCK_ATTR = "_fairshare_upstream_clock"
UPSTREAM_CLOCK_TARGETS: tuple[HookSpec, ...] = (
    HookSpec(f"{_SCHEDULER}._get_new_batch_prefill_raw", HookType.AROUND, around_upstream_prefill_raw_clocked),
)
UPSTREAM_TRACE_TARGETS: tuple[HookSpec, ...] = (
    HookSpec(f"{_SCHEDULER}.get_prefill_adder_class", HookType.AROUND, around_upstream_adder_traced),
    HookSpec(f"{_SCHEDULER}._get_new_batch_prefill_raw", HookType.AROUND, around_upstream_prefill_traced),
)
