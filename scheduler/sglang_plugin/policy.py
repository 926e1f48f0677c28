"""The plugin's `PolicyConfig`: the operator's ``FAIRSHARE_*`` values, with sglang's own where they are silent.

`plugin_policy` is the one place the fill rules live, and both sides of a replica call it:

- inside sglang, on the values one scheduler resolved (`policy_config_for`): the policy the plugin runs;
- in a launcher (the Serve replica), on the server arguments it is about to start sglang with (`predicted_policy`):
  the same policy before sglang has started, for what the launcher derives from it (routing, backpressure).

The rules: sglang's concurrency limit is the policy's ``max_running_requests`` (so F follows it, the article's rule)
and its chunk size the ``chunk_budget_tokens`` (``chunked_prefill_size``; with chunking off, ``max_prefill_tokens``),
unless the operator set them; the interactive pass and the documents' floor default to no more than that budget;
mixed decode and the decode interval are always what sglang resolved (the operator's switches were written onto its
arguments: `server_args`); skip-ahead and the tenants' order are off under priority scheduling (overtaking by
arrival or by tenant would defeat priorities); with chunking off there is nothing to share or size.

sglang computes some of its values only as it starts: its concurrency limit from memory when unset (a given one it
may still cap by KV capacity, or divide among DP attention workers), its chunk size by GPU when unset. Predicted
from arguments those are unknown (None) and the policy's own default stands until the plugin reports what it runs:
it publishes its policy in the scheduler's internal state (``fairshare.policy``: `attach.SchedulerPolicy.describe`),
which a launcher reads back (`serve_app.config.sglang_engine.reported_policy`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scheduler.config import PolicyConfig, default_interactive_pass_tokens, default_long_pass_floor_tokens
from scheduler.sglang_plugin.env import explicit_policy_env
from scheduler.sglang_plugin.server_args import policy_server_args

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class SglangValues:
    """sglang's values the policy follows, as one scheduler resolved them or as server arguments predict them;
    None: not known before sglang starts (it computes the value then)."""

    chunking: bool
    """Chunked prefill is on (a positive ``chunked_prefill_size``)."""
    chunked_prefill_size: int | None
    """The chunk size with chunking on."""
    max_prefill_tokens: int | None
    """The prefill budget with chunking off."""
    max_running_requests: int | None
    mixed_chunk: bool
    """Decoding streams ride in prefill passes (sglang's resolved ``enable_mixed_chunk``, never on without chunking)."""
    prefill_decode_interval: int
    priority_scheduling: bool


def policy_defaults() -> dict[str, Any]:
    """Every `PolicyConfig` field at its declared default (no environment read)."""
    return {name: f.get_default(call_default_factory=True) for name, f in PolicyConfig.model_fields.items()}


def plugin_policy(explicit: Mapping[str, object], engine: SglangValues) -> PolicyConfig:
    """The policy the plugin runs: the operator's `explicit` values (`env.explicit_policy_env`, parsed), sglang's
    `engine` values where they are silent, the declared defaults elsewhere (raises pydantic's ValidationError on a bad
    value)."""
    fills: dict[str, object] = {
        "mixed_decode": engine.mixed_chunk,
        "decode_steps_per_prefill": engine.prefill_decode_interval,
    }
    if "max_running_requests" not in explicit and engine.max_running_requests is not None:
        fills["max_running_requests"] = engine.max_running_requests
    chunk = engine.chunked_prefill_size if engine.chunking else engine.max_prefill_tokens
    if "chunk_budget_tokens" not in explicit and chunk is not None:
        fills["chunk_budget_tokens"] = chunk
    values = {**policy_defaults(), **explicit, **fills}
    budget: int = values["chunk_budget_tokens"]
    if "interactive_pass_tokens" not in explicit:
        values["interactive_pass_tokens"] = default_interactive_pass_tokens(budget)
    if "long_pass_floor_tokens" not in explicit:
        values["long_pass_floor_tokens"] = default_long_pass_floor_tokens(budget)
    if engine.priority_scheduling:
        values.update(skip_ahead=False, tenant_fairness=False)
    if not engine.chunking:
        values.update(fair_share=False, adaptive_pass=False)
    return PolicyConfig(**values)


def scheduler_values(sched: Scheduler) -> SglangValues:
    """The values one scheduler resolved (read at the end of its ``__init__``)."""
    return SglangValues(
        chunking=sched.chunked_prefill_size is not None,
        chunked_prefill_size=sched.chunked_prefill_size,
        max_prefill_tokens=sched.max_prefill_tokens,
        max_running_requests=sched.max_running_requests,
        mixed_chunk=bool(sched.is_mixed_chunk),
        prefill_decode_interval=int(sched.prefill_decode_interval or 0),
        priority_scheduling=bool(sched.enable_priority_scheduling),
    )


def policy_config_for(sched: Scheduler) -> PolicyConfig:
    """The policy the plugin runs in one scheduler: `plugin_policy` on this process's ``FAIRSHARE_*`` variables and
    the scheduler's values (raises pydantic's ValidationError on a bad ``FAIRSHARE_*`` value)."""
    return plugin_policy(explicit_policy_env(), scheduler_values(sched))


def server_args_values(args: Mapping[str, Any]) -> SglangValues:
    """What sglang resolves from these ``sglang.Engine`` / `ServerArgs` arguments where it takes them as given; None
    where it computes the value as it starts: the chunk size by GPU when unset, the concurrency limit from memory when
    unset, both under DP attention (divided among its workers). sglang may still adjust a given value (KV capacity caps
    the concurrency limit, a shard granule rounds the chunk, an attention backend turns chunking off): what the plugin
    then runs is the scheduler's, which it reports."""
    chunk = args.get("chunked_prefill_size")
    chunking = chunk is None or chunk > 0
    divided = bool(args.get("enable_dp_attention"))
    return SglangValues(
        chunking=chunking,
        chunked_prefill_size=None if divided or not chunking else chunk,
        max_prefill_tokens=args.get("max_prefill_tokens"),
        max_running_requests=None if divided else args.get("max_running_requests"),
        mixed_chunk=chunking and bool(args.get("enable_mixed_chunk", False)),
        prefill_decode_interval=int(args.get("prefill_decode_interval") or 0),
        priority_scheduling=bool(args.get("enable_priority_scheduling", False)),
    )


def predicted_policy(explicit: Mapping[str, object], server_args: Mapping[str, Any]) -> PolicyConfig:
    """The policy the plugin will run in an sglang started with `server_args` and the ``FAIRSHARE_*`` values
    `explicit`: the plugin's switches written onto the arguments first (`server_args.apply_policy_env`), then
    `plugin_policy` on what they predict (`server_args_values`)."""
    written = {arg: value for arg, (value, _) in policy_server_args(explicit).items()}
    return plugin_policy(explicit, server_args_values({**server_args, **written}))
