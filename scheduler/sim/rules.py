"""Named rule sets: which scheduler and which policy settings an engine runs.

A policy spec is ``NAME`` or ``NAME:key=value,key=value`` (keys are `PolicyConfig` fields, or
for `vllm` the `VllmScheduler` arguments), e.g. ``fairshare:interactive_pass_tokens=256``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import TypeAdapter, ValidationError

from scheduler.config import PolicyConfig, default_interactive_pass_tokens
from scheduler.sim.engine import StepScheduler
from scheduler.sim.presets import Preset
from scheduler.sim.schedulers import PolicyScheduler, VllmScheduler

NO_STARVATION_GUARD = 10**9
PREPATCH_CAP_TOKENS = 4096


class RuleSet(StrEnum):
    BASELINE = "baseline"  # sglang 0.5.23 upstream
    ARTICLE_PATCH = "article-patch"  # the article's patched sglang
    ARTICLE_PREPATCH = "article-prepatch"  # that patch before its fixes: F fixed at 4096, no skip-ahead
    VLLM = "vllm"  # vLLM V1 as the step-comparison article reads it
    FAIRSHARE = "fairshare"  # our policy core, best settings


def policy_for(rules: RuleSet, preset: Preset, **overrides: Any) -> tuple[PolicyConfig, int]:
    """The policy config and the half-prefilled-request limit of a sglang-like rule set."""
    if rules is RuleSet.BASELINE:
        base: dict[str, Any] = dict(
            skip_ahead=False,
            fair_share=False,
            adaptive_pass=False,
            mixed_decode=False,
            interactive_reserve=False,
            short_decode_interleave=False,
            chunk_budget_tokens=preset.baseline_chunk_tokens,
            max_skipped_passes=NO_STARVATION_GUARD,
        )
        max_cut = 1
    elif rules in (RuleSet.ARTICLE_PATCH, RuleSet.ARTICLE_PREPATCH):
        base = dict(
            skip_ahead=rules is RuleSet.ARTICLE_PATCH,
            lookahead=16,
            max_skipped_passes=NO_STARVATION_GUARD,
            fair_share=True,
            full_budget_when_alone=False,
            adaptive_pass=False,
            mixed_decode=False,
            interactive_reserve=False,
            short_decode_interleave=False,
            chunk_budget_tokens=preset.chunk_budget_tokens,
        )
        if rules is RuleSet.ARTICLE_PREPATCH:
            # The patched engine's log before the fix shows passes of "4096 + 30": a 4096 cap per request.
            base["per_request_cap_tokens"] = PREPATCH_CAP_TOKENS
        max_cut = 8
    elif rules is RuleSet.FAIRSHARE:
        base = dict(
            chunk_budget_tokens=preset.chunk_budget_tokens,
            quiet_pass_tokens=preset.quiet_pass_tokens,
            interactive_pass_tokens=preset.interactive_pass_tokens,
            ttft_target_s=preset.ttft_target_s,
            tbt_target_s=preset.tbt_target_s,
        )
        max_cut = 1
    else:
        raise ValueError(f"{rules.value} is not a sglang-like rule set")
    base["max_running_requests"] = preset.max_running_requests
    base.setdefault("interactive_pass_tokens", default_interactive_pass_tokens(base["chunk_budget_tokens"]))
    max_cut = int(overrides.pop("max_cut_requests", max_cut))
    return PolicyConfig(**{**base, **overrides}), max_cut


def make_scheduler(spec: str, preset: Preset) -> StepScheduler:
    name, overrides = parse_spec(spec)
    if name is RuleSet.VLLM:
        args: dict[str, Any] = dict(
            budget_tokens=preset.vllm_budget_tokens, max_running_requests=preset.max_running_requests * 8
        )
        return VllmScheduler(**{**args, **overrides})
    cfg, max_cut = policy_for(name, preset, **overrides)
    return PolicyScheduler(cfg, max_cut_requests=max_cut, pass_cost=preset.cost)


def parse_spec(spec: str) -> tuple[RuleSet, dict[str, Any]]:
    name, _, rest = spec.partition(":")
    try:
        rules = RuleSet(name)
    except ValueError:
        raise ValueError(f"unknown policy {name!r}; choose from {[r.value for r in RuleSet]}") from None
    overrides: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"policy option {item!r} in {spec!r} is not key=value")
        overrides[key.strip()] = _parse_value(value.strip())
    return rules, overrides


def _parse_value(text: str) -> Any:
    if text.lower() in ("none", "null"):
        return None
    try:
        return TypeAdapter(int | float | bool).validate_strings(text)
    except ValidationError:
        return text
