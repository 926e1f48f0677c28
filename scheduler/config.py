"""The policy's one typed config object, validated at start.

Every knob can be overridden by an environment variable ``FAIRSHARE_<FIELD>`` (upper case), so the
same switches work in the simulator, in the sglang plugin and in the Serve replicas. Derived values
(the per-request cap ``F``) are computed here and nowhere else: the source article's rule is that F
follows the concurrency limit and is never configured twice.
"""

from __future__ import annotations

import json
from typing import Self

from pydantic import Field, PositiveFloat, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from scheduler.traffic import TrafficClass, classify

ENV_PREFIX = "FAIRSHARE_"


class PolicyConfig(BaseSettings):
    """Scheduler policy knobs. Defaults are the project's best settings (the `fairshare` policy)."""

    # An empty variable means "not set"; "none" sets an optional knob to None.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="forbid", env_ignore_empty=True, env_parse_none_str="none"
    )

    skip_ahead: bool = Field(
        True,
        description="Keep scanning the waiting queue past a request rejected for KV capacity. "
        "Off = strict FCFS, identical to upstream sglang.",
    )
    lookahead: int = Field(
        16, ge=0, description="After the first capacity rejection, examine at most this many more waiting requests."
    )
    max_skipped_passes: int = Field(
        256,
        ge=1,
        description="A request skipped for capacity in this many passes holds a reservation: no later long "
        "request may overtake it, only short ones (anti-starvation; the article's patch had none).",
    )
    fair_share: bool = Field(
        True,
        description="Share each pass max-min fairly among the requests that can run in it, none above F when "
        "contended (the article's min(F, budget / n)). Off = first come takes the budget (upstream).",
    )
    tenant_fairness: bool = Field(
        True,
        description="Share passes among tenants before requests: admission in virtual-token-counter order and "
        "each pass's long tokens by tenant weight (scheduler.tenants). Off, or with one tenant: by request.",
    )
    tenant_weights: dict[str, PositiveFloat] = Field(
        default_factory=dict,
        description="Weight by tenant for requests that carry none (the plugin used on its own; the Serve app "
        'sends each request\'s weight with it); a JSON object in the environment, e.g. {"acme": 2}. Unnamed: 1.',
    )
    full_budget_when_alone: bool = Field(
        True, description="A request that prefills alone, with nobody contending, gets the whole pass budget."
    )
    chunk_budget_tokens: int = Field(8192, ge=1, description="Most prefill tokens in one forward pass.")
    max_running_requests: int = Field(
        10, ge=1, description="Engine concurrency limit; F is derived from it: N = 2 * this, F = budget / N."
    )
    per_request_cap_tokens: int | None = Field(
        None, ge=1, description="Set F explicitly instead of deriving it from max_running_requests."
    )
    adaptive_pass: bool = Field(
        True,
        description="Size passes for interactive traffic: from the SLO targets and the engine's pass-cost model "
        "(`slo_sizing`), else by the static knobs below. Off = every pass may use the chunk budget.",
    )
    slo_sizing: bool = Field(
        True,
        description="Each pass is the largest the engine's pass-cost model predicts keeps `ttft_target_s` and "
        "`tbt_target_s` (scheduler.slo_sizing). Off, or with no usable cost model, the static knobs "
        "`interactive_pass_tokens`, `quiet_pass_tokens`, `short_pass_extra_tokens` and `activity_window_passes`.",
    )
    ttft_target_s: float = Field(
        0.5,
        gt=0,
        description="Interactive (short) requests' time-to-first-token target, p99, seconds: a chat arriving "
        "mid-pass waits the rest of that pass and its own pass.",
    )
    tbt_target_s: float = Field(
        0.3,
        gt=0,
        description="Interactive streams' time-between-tokens target, p99, seconds: bounds every pass while short "
        "streams decode (they ride in it, or wait for it).",
    )
    delivery_margin_s: float = Field(
        0.0,
        ge=0,
        description="Seconds of each target the passes leave to the path from the engine to the client (a serving "
        "front's hops, the network): passes are sized against `ttft_target_s` and `tbt_target_s` less this "
        "(`planned_ttft_s`, `planned_tbt_s`), where the client judges the targets. 0: the engine's own output is "
        "judged.",
    )
    pass_throughput_slack: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="Within the targets' bounds, a pass carries the fewest document tokens whose passes' fixed "
        "costs, as the pass-cost model predicts them, add at most this fraction to the documents' prefill time in the "
        "largest passes the bounds allow (scheduler.slo_sizing.throughput_knee): shorter passes shorten the chats' "
        "waits where the model says they cost documents little (a CPU engine). None: the largest pass the targets "
        "allow.",
    )
    admit_pass_long_tokens: int | None = Field(
        None,
        ge=0,
        description="With SLO sizing, a pass that admits short requests carries at most this many document tokens "
        "beside them, whatever the bounds allow: a chat's own pass is then short, and the documents go on in the "
        "next. The chat's first token comes a document pass sooner; the documents pay one more pass per chat "
        "(docs/tuning.md). None: as many as the bounds allow.",
    )
    pass_overrun_quantile: float = Field(
        0.9,
        ge=0,
        le=1,
        description="The pass-cost fit's stated error, which every predicted second is charged with against the "
        "targets: this quantile of the latest prefill passes' overrun of their predictions (measured / predicted - 1; "
        "scheduler.pass_cost_fit). A chat waits for whole passes and the targets are p99s: lower trades the chats' "
        "tail for bigger passes (0.5: the median overrun).",
    )
    slot_aware_passes: bool = Field(
        True,
        description="While short streams decoding hold more than the interactive reserve of running slots and a "
        "short request waits for one (or no more than the reserve is free), passes carry no long prefill beyond "
        "long_pass_floor_tokens, so streams finish at decode speed and give slots back. Off = passes ignore the "
        "slots, and past the slot limit chats queue for a slot at the big passes' pace.",
    )
    long_pass_floor_tokens: int = Field(
        128,
        ge=0,
        description="Long prefill tokens a pass keeps when no pass size can keep a target, or while chats lack "
        "running slots (the documents' progress floor under chat overload: about a third of prefill speed on the "
        "presets; passes that miss a target are counted). 0 = none.",
    )
    missed_pass_stretch: float = Field(
        2.0,
        ge=1.0,
        description="Where no pass size keeps a target, a pass that admits no chat may spend on documents up to this "
        "many times what long_pass_floor_tokens already costs it: where a document's presence costs most of a pass "
        "(deep padded attention on CPU) it carries thousands of tokens instead of crawling; with linear costs a few "
        "more than the floor. 1 = the floor.",
    )
    short_request_tokens: int = Field(
        2048, ge=1, description="A request whose uncached prompt is at most this many tokens counts as short."
    )
    interactive_pass_tokens: int = Field(
        512, ge=1, description="Pass budget while short requests are active: bounds their wait and their ITL."
    )
    short_pass_extra_tokens: int = Field(
        64,
        ge=0,
        description="In a pass that admits short requests, long requests share at most this many tokens beside "
        "them: a newly arrived short request runs in a pass nearly of its own.",
    )
    activity_window_passes: int = Field(
        32,
        ge=0,
        description="Forward passes after the last short admission during which activity counts as recent "
        "(every pass the engine runs, decode-only ones included).",
    )
    quiet_pass_tokens: int | None = Field(
        None,
        ge=1,
        description="Pass budget with no recent short activity; None = the chunk budget. Smaller passes make "
        "the first short arrival wait less and cost a lone document throughput (see the simulator's frontier).",
    )
    interactive_reserve: bool = Field(
        True,
        description="Keep running slots and KV tokens that long requests may not take, so short requests are "
        "never locked out by documents holding every slot or all free KV. Off = upstream's first come.",
    )
    reserve_slots: int | None = Field(
        None,
        ge=0,
        description="Running slots long requests leave free; None = max(1, max_running_requests // 8).",
    )
    reserve_kv_tokens: int | None = Field(
        None,
        ge=0,
        description="KV tokens long requests leave free; None = reserve slots x 2 x short_request_tokens "
        "(a short prompt plus as much output).",
    )
    mixed_decode: bool = Field(
        True,
        description="Decoding streams ride along in prefill passes (sglang's --enable-mixed-chunk, which the plugin "
        "turns on unless this is set false; sglang still turns it off where it is unsupported). Measured against "
        "decode-only interleave in the simulator: it saves a pass's fixed cost per token.",
    )
    decode_steps_per_prefill: int = Field(
        0, ge=0, description="Decode-only passes run after each prefill pass (sglang's prefill-decode interval)."
    )
    cpu_overlap_schedule: bool = Field(
        True,
        description="sglang's overlap scheduler on a CPU device (--device cpu). A CPU runs each pass as it is "
        "launched, so the overlap loop overlaps no work there; it only sends a pass's tokens after the next pass "
        "has run, so a chat's first token waits one pass more (the SLO sizer keeps that pass minimal: "
        "output_lag_passes). False: the plugin runs sglang's normal loop on CPU (--disable-overlap-schedule). No "
        "effect on any other device.",
    )
    short_decode_interleave: bool = Field(
        True,
        description="With mixed decode off, run one decode-only pass after each prefill pass while short "
        "requests' streams decode, so their tokens keep coming during a document's prefill.",
    )
    diagnostics: bool = Field(False, description="Log one line per rejection and a per-pass budget breakdown.")

    @model_validator(mode="after")
    def _check_budgets(self) -> Self:
        for name in ("interactive_pass_tokens", "quiet_pass_tokens", "long_pass_floor_tokens"):
            value = getattr(self, name)
            if value is not None and value > self.chunk_budget_tokens:
                raise ValueError(f"{name}={value} exceeds chunk_budget_tokens={self.chunk_budget_tokens}")
        return self

    @model_validator(mode="after")
    def _check_margin(self) -> Self:
        if self.delivery_margin_s >= min(self.ttft_target_s, self.tbt_target_s):
            raise ValueError(
                f"delivery_margin_s={self.delivery_margin_s} leaves nothing of a target (ttft_target_s="
                f"{self.ttft_target_s}, tbt_target_s={self.tbt_target_s})"
            )
        return self

    @property
    def planned_ttft_s(self) -> float:
        """The TTFT the engine's passes are sized to keep: the target less the delivery margin."""
        return self.ttft_target_s - self.delivery_margin_s

    @property
    def planned_tbt_s(self) -> float:
        """The time between tokens the engine's passes are sized to keep: the target less the delivery margin."""
        return self.tbt_target_s - self.delivery_margin_s

    @property
    def prefill_concurrency(self) -> int:
        """N in the article's rule: twice the concurrency limit."""
        return self.max_running_requests * 2

    @property
    def cap_tokens(self) -> int:
        """F: the most tokens one request gets in a contended pass."""
        if self.per_request_cap_tokens is not None:
            return self.per_request_cap_tokens
        return max(1, self.chunk_budget_tokens // self.prefill_concurrency)

    @property
    def reserved_slots(self) -> int:
        """Running slots only short requests may take (0 with the reserve off)."""
        if not self.interactive_reserve:
            return 0
        if self.reserve_slots is not None:
            return self.reserve_slots
        return max(1, self.max_running_requests // 8)

    @property
    def reserved_kv_tokens(self) -> int:
        """KV tokens only short requests may take (0 with the reserve off)."""
        if not self.interactive_reserve:
            return 0
        if self.reserve_kv_tokens is not None:
            return self.reserve_kv_tokens
        return self.reserved_slots * 2 * self.short_request_tokens

    def is_short(self, uncached_prompt_tokens: int) -> bool:
        """Whether a request counts as short (interactive): `scheduler.traffic.classify` with this config's knob."""
        return classify(uncached_prompt_tokens, self.short_request_tokens) is TrafficClass.SHORT

    def describe_cap(self) -> str:
        """The start-up line, in the article's wording."""
        if self.per_request_cap_tokens is not None:
            return f"Prefill cap set explicitly: long_prefill_token_threshold={self.cap_tokens}"
        return f"Prefill concurrency N={self.prefill_concurrency}: long_prefill_token_threshold={self.cap_tokens}"

    def with_overrides(self, **changes: object) -> PolicyConfig:
        """A validated copy with some fields changed (config objects are frozen)."""
        return type(self)(**{**self.model_dump(), **changes})


def default_interactive_pass_tokens(limit_tokens: int) -> int:
    """The default interactive pass budget, no bigger than `limit_tokens` (an engine's smaller chunk
    budget, or a quiet pass size): the config refuses an interactive pass above the chunk budget."""
    default: int = PolicyConfig.model_fields["interactive_pass_tokens"].default
    return min(default, limit_tokens)


def default_long_pass_floor_tokens(chunk_budget_tokens: int) -> int:
    """The documents' default progress floor, no bigger than an engine's (smaller) chunk budget: the config refuses
    a floor above it."""
    default: int = PolicyConfig.model_fields["long_pass_floor_tokens"].default
    return min(default, chunk_budget_tokens)


def env_var_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def env_value(value: object) -> str:
    """A knob's value as its environment variable holds it: ``none`` for None, JSON for a mapping (how pydantic's
    settings read a complex field), else its text."""
    if value is None:
        return "none"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)
