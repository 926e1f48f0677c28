"""SLO-driven pass sizing: the largest pass the engine's pass-cost model predicts keeps the interactive targets.

A forward pass in flight cannot be interrupted, so the policy keeps its service levels by bounding each pass:

- **Time between tokens.** While short requests' streams decode, every pass is a gap between their tokens: with
  mixed decode they ride in it; without, they wait for it and then for a decode-only pass. So a pass lasts at
  most ``tbt_target_s`` (less that decode-only pass).
- **Time to first token.** A chat that arrives during a pass waits for the rest of it, for
  ``admission_lag_passes`` more (an engine that plans a pass before it sees the arrivals of the pass in flight:
  sglang's overlap scheduler), then runs in its own pass, and its first token leaves the engine after
  ``output_lag_passes`` more (sglang's overlap scheduler on CPU). Every pass leaves room for that own pass and for
  the passes after it, each as short as it: it lasts at most ``(ttft_target_s - (1 + out) x own) / (1 + lag)``,
  where ``own`` is the pass that would admit a chat of `ChatPrompts.reserve_tokens` beside the streams decoding
  now. So a pass planned while no chat has been seen for long is bounded too. A pass that admits short requests
  also gets no more than their wait left: ``ttft_target_s - (1 + lag) x`` the last pass's predicted seconds, less
  the ``out`` passes after it; and the pass right after it, which their first tokens wait for, is the minimal
  pass (no long prefill beyond the floor: `SizedBy.OUTPUT`), which the bounds count as long as ``own``. With
  `PolicyConfig.admit_pass_long_tokens` set, a pass that admits short requests carries no more document tokens than
  that (`SizedBy.ADMIT_CAP`): the chat's own pass is then as short as the bounds assume ``own`` is.
- **Running slots** (`scheduler.pass_budget.slots_short`, with or without a cost model): while short streams hold
  more than their reserve of slots and short requests lack one, passes carry no long prefill beyond the floor, so
  streams finish at decode speed. A pass that admits short requests that waited for a slot gets what their whole
  wait left of the TTFT target.

Where the client judges the targets, the path to it (a serving front's hops) takes a little of each: the bounds are
the targets less `PolicyConfig.delivery_margin_s` (`planned_ttft_s`, `planned_tbt_s`).

Within those bounds a pass carries as much long prefill as the model predicts fits: bisection on the model, which
must be non-decreasing in each argument, so the pass size is non-decreasing in each target wherever the targets can
be kept. With ``pass_throughput_slack`` set it carries fewer: the fewest long tokens whose passes' fixed costs add at
most that slack to what the documents' tokens cost in the largest pass (`throughput_knee`, `SizedBy.THROUGHPUT`),
which on an engine whose passes cost little beyond their tokens (CPU) is well short of the largest. The long tokens are
charged at the largest context among the long requests sharing the pass (exact when one does, an upper bound when
several do). A target that even the minimal pass (the short requests admitted, the
decode rows, and in a pass that admits none ``long_pass_floor_tokens`` of documents) breaks is a miss, which the
planner counts and logs: the pass is the minimal one, its documents' share stretched by ``missed_pass_stretch``
(what the floor costs the pass, times that), so documents keep moving where the floor's cost is mostly fixed.

Every predicted second counts ``1 +`` the model's stated relative error against the bounds (`charge_of`; a model
that states none, as the simulator's presets, is charged nothing): the pass being sized, the chat's own pass and the
decode-only pass the bounds leave room for, and the passes a chat has already waited through. A model that is 15%
off then plans passes that keep the targets when they run 15% over their prediction; a larger stated error never
plans a bigger pass wherever the targets can be kept.

A model that cannot predict — it raises, or returns something other than a finite non-negative number, which is
how an online fit with no data yet should answer, or states an error that is not one — raises `UnusableCost`: the
planner then sizes the pass with the static knobs.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from scheduler.config import PolicyConfig
from scheduler.pass_cost import (
    PassCost,
    attention_of,
    chunk_ctx_pairs,
    extend_pairs,
    loop_overhead_of,
    riding_figures,
    stated_error_of,
)

logger = logging.getLogger("fairshare.scheduler")

CHAT_PROMPT_WINDOW = 100
"""Short prompts remembered for the TTFT reserve."""
CHAT_PROMPT_QUANTILE = 0.99
"""The targets are p99s: the reserve is the 99th percentile (nearest rank) of the remembered prompts."""
CHAT_PROMPT_PRIOR_TOKENS = 256
"""The reserve before any short request has been admitted: a typical chat prompt (a few hundred tokens)."""


class SizedBy(StrEnum):
    """What set a pass's size."""

    STATIC = "static"  # the static knobs: SLO sizing off, no usable cost model, or adaptive passes off
    CHUNK = "chunk"  # the chunk budget: every target holds at it
    TBT = "tbt"
    TTFT = "ttft"  # room for a chat that arrives during this pass
    ADMIT = "admit"  # what the wait of the short requests this pass admits left of their TTFT
    ADMIT_CAP = "admit_cap"  # the pass admits short requests, and the bounds allowed more: `admit_pass_long_tokens`
    OUTPUT = "output"  # the last pass admitted short requests, whose first tokens leave after this one: minimal
    THROUGHPUT = "throughput"  # the documents lose at most `pass_throughput_slack` against the largest pass
    SLOTS = "slots"  # short requests lack running slots: no long prefill beyond the floor
    IDLE = "idle"  # nobody to prefill: not sized


class Target(StrEnum):
    TTFT = "ttft"
    TBT = "tbt"


class UnusableCost(ValueError):
    """The pass-cost model cannot predict this pass."""


@dataclass(frozen=True, slots=True)
class PassLoad:
    """What one pass costs besides the long prefill tokens the controller chooses."""

    short_tokens: int
    """Prefill tokens of the short requests the pass admits (they are served whole)."""
    short_ctx_pairs: float
    long_ctx_tokens: int
    """The largest context a long request sharing the pass attends to."""
    num_decoding: int
    decode_ctx_tokens: int
    """The decoding streams' contexts, summed."""
    rows_ride: bool
    """Decoding streams ride in the pass (mixed decode); otherwise they wait for it and a decode-only pass."""
    num_short_decoding: int
    admission_lag_passes: int
    limit_long_tokens: int
    """The most long tokens the chunk budget leaves."""
    num_long_sharers: int
    """Long requests that may share the pass (none and no short admitted: nothing to size)."""
    output_lag_passes: int = 0
    free_running_slots: int = 1
    """Running slots still free once the pass's admissions are counted."""
    short_waits_for_slot: bool = False
    """A short request is left waiting with no running slot free."""

    @property
    def riding(self) -> tuple[int, int]:
        """(rows, their contexts) of the decoding streams riding in the pass."""
        return (self.num_decoding, self.decode_ctx_tokens) if self.rows_ride else (0, 0)


@dataclass(frozen=True, slots=True)
class PassSize:
    long_tokens: int
    by: SizedBy
    bound_s: float | None = None
    missed: tuple[Target, ...] = ()
    """Targets that even the minimal pass breaks (the pass then carries the documents' floor, stretched by
    `missed_pass_stretch`)."""
    minimal_s: float | None = None
    """The minimal pass's predicted seconds, charged with the model's stated error (what a missed target is up
    against)."""


@dataclass(frozen=True, slots=True)
class _Bound:
    seconds: float
    by: SizedBy
    target: Target


@dataclass
class ChatPrompts:
    """Recent short requests' prompt sizes (state across passes): the TTFT reserve is their 99th percentile."""

    sizes: deque[int] = field(default_factory=lambda: deque(maxlen=CHAT_PROMPT_WINDOW))
    reserve_tokens: int = CHAT_PROMPT_PRIOR_TOKENS

    def record(self, tokens: list[int]) -> None:
        if not tokens:
            return
        self.sizes.extend(tokens)
        ordered = sorted(self.sizes)
        self.reserve_tokens = ordered[math.ceil(CHAT_PROMPT_QUANTILE * len(ordered)) - 1]


def checked(value: object, what: str = "answered") -> float:
    if isinstance(value, bool) or not isinstance(value, float | int) or not 0 <= value < math.inf:
        raise UnusableCost(f"the pass-cost model {what} {value!r}")
    return float(value)


def charge_of(cost: PassCost) -> float:
    """What each of `cost`'s predicted seconds counts for against the bounds: ``1 +`` its stated relative error
    (`scheduler.pass_cost.stated_error_of`), or `UnusableCost` when it states no finite non-negative error."""
    try:
        error = stated_error_of(cost)
    except Exception as exc:  # the model is the engine's: a failure to state its error means it cannot be trusted
        raise UnusableCost(f"the pass-cost model's stated error raised {exc!r}") from exc
    return 1.0 + checked(error, "states a relative error of")


def predict(cost: PassCost, prefill_tokens: int, prefill_ctx_pairs: float, rows: int, rows_ctx: int) -> float:
    """`cost.pass_s` of a pass with `rows` decoding streams whose contexts sum to `rows_ctx` (their attention as the
    model's engine computes it: `riding_figures`), or `UnusableCost` when it cannot answer."""
    row_pairs, rows_ctx = riding_figures(attention_of(cost), prefill_tokens > 0, rows, rows_ctx)
    try:
        seconds = cost.pass_s(prefill_tokens, prefill_ctx_pairs + row_pairs, rows, rows_ctx)
    except Exception as exc:  # the model is the engine's (an online fit): any failure means it cannot predict
        raise UnusableCost(f"the pass-cost model raised {exc!r}") from exc
    return checked(seconds)


def largest_within(bound_s: float, floor: int, limit: int, seconds: Callable[[int], float]) -> int:
    """The most tokens in [floor, limit] whose pass `seconds` predicts within `bound_s`; `floor` when none."""
    if limit <= floor:
        return floor
    if seconds(limit) <= bound_s:
        return limit
    lo, hi = floor, limit  # seconds(hi) > bound; seconds(lo) <= bound unless lo is the floor
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if seconds(mid) <= bound_s:
            lo = mid
        else:
            hi = mid
    return lo


def throughput_knee(
    slack: float, floor: int, tokens: int, seconds: Callable[[int], float], overhead_s: float = 0.0
) -> int:
    """The fewest long tokens in [floor, tokens] whose passes cost the documents at most ``slack`` more time than
    passes of `tokens` would. A pass's cost is a fixed part (its launch, the short requests and decoding rows it
    carries, and the scheduler's own work between passes, `overhead_s`, which the pass's timing does not include:
    `scheduler.pass_cost.loop_overhead_of`) plus what its document tokens cost, each token at least as much as the
    one before it (it attends to one more). Split into passes of ``n``, `tokens` document tokens pay the fixed part
    ``tokens / n`` times instead of once, and the same token cost: each token attends to the same prefix in whichever
    pass it runs. So ``(tokens / n - 1) x fixed <= slack x (fixed + tokens x token)``, with both parts read off the
    model at the current depth (``token``: the second token's cost; ``fixed``: the one-token pass less it, plus
    `overhead_s`). Over a whole document the fixed parts it then pays add at most ``slack`` to its prefill time
    with the largest passes, plus one for its last pass's fragment (`tests/test_slo_sizing.py`).

    A pass's own rate (its tokens over its seconds) is the wrong measure here: a larger pass's tokens sit deeper on
    average, and the attention they pay for a smaller pass only defers to the next one. On the CPU engines that
    measure put the peak under a thousand tokens, and passes sized within 2% of it cost two engines prefilling side
    by side 6-7% of their documents' rate (docs/slo.md). Non-decreasing in `tokens` and in `overhead_s`, so the
    pass size stays non-decreasing in each target."""
    lo = max(floor, 1)
    if tokens <= lo:
        return tokens
    token_s = max(seconds(2) - seconds(1), 0.0)
    fixed_s = seconds(1) - token_s + overhead_s
    if fixed_s <= 0:
        return lo  # passes cost nothing beyond their tokens: the fewest carry documents as fast
    fewest = tokens * fixed_s / (fixed_s + slack * (fixed_s + tokens * token_s))
    return min(tokens, max(lo, math.ceil(fewest * (1 - 1e-12))))  # a rounding error adds no token


def in_flight_bound_s(
    ttft_target_s: float,
    own_pass_s: float,
    admission_lag_passes: int,
    output_lag_passes: int = 0,
    decode_pass_s: float = 0.0,
) -> float:
    """The longest a pass may last and a chat that arrives during it still keep `ttft_target_s`: the chat waits for the
    rest of it and for `admission_lag_passes` more (planned before the engine sees the chat), then runs in its own
    pass of `own_pass_s`, after which its first token waits `output_lag_passes` more, each as short as its own. What
    the target leaves beside those is split evenly between the pass in flight and the passes planned ahead; each is
    followed by a decode-only pass of `decode_pass_s` where short streams are owed one (mixed decode off). The sizer's
    TTFT bound on every pass (`SloSizer.bounds`), and the bound routers predict a chat's wait with (`arrival_wait_s`).
    Negative where even the chat's own passes break the target."""
    after_s = output_lag_passes * own_pass_s
    return (ttft_target_s - own_pass_s - after_s) / (1 + admission_lag_passes) - decode_pass_s


def sizes_from_targets(cfg: PolicyConfig) -> bool:
    """Whether the policy sizes passes from its targets (where the engine's pass-cost model can predict them)."""
    return cfg.adaptive_pass and cfg.slo_sizing


def arrival_wait_s(
    cfg: PolicyConfig, own_pass_s: float | None, admission_lag_passes: int, output_lag_passes: int = 0
) -> float:
    """The longest pass a chat arriving now may wait for, in seconds, at an engine with no streams decoding: the TTFT
    bound the sizer puts on every pass (`in_flight_bound_s`), with the chat's own pass `own_pass_s`
    (`SloSizer.arrival_own_pass_s`) and the engine's lags. 0 where no seconds bound the pass: the policy does not size
    passes from its targets, or the cost model cannot predict (`own_pass_s` None: the static knobs size passes), or
    the chat's own passes alone break the target (the sizer then plans minimal passes)."""
    if not sizes_from_targets(cfg) or own_pass_s is None:
        return 0.0
    return max(0.0, in_flight_bound_s(cfg.planned_ttft_s, own_pass_s, admission_lag_passes, output_lag_passes))


def long_floor_tokens(cfg: PolicyConfig, load: PassLoad) -> int:
    """The long prefill a pass keeps whatever bounds it (no size keeps a target, or chats lack running slots), so
    documents keep moving under chat overload; a pass that admits short requests is theirs, and the documents go
    on in the next."""
    return 0 if load.short_tokens else min(cfg.long_pass_floor_tokens, load.limit_long_tokens)


@dataclass
class SloSizer:
    """The controller's state across passes: the last pass's predicted seconds and the chat-prompt reserve."""

    last_pass_s: float | None = None
    """Predicted seconds of the last pass planned; None when it was not predicted (an idle pass, no model)."""
    queued_s: float | None = None
    """While passes leave a short request waiting for a slot: the predicted seconds it has waited (from the pass
    before the first that left it waiting); None when the last pass left none waiting."""
    chat_prompts: ChatPrompts = field(default_factory=ChatPrompts)
    admitted_short: bool = False
    """The last pass planned admitted short requests."""

    def size(self, cfg: PolicyConfig, cost: PassCost, load: PassLoad, slots_short: bool) -> PassSize:
        """The long prefill tokens of this pass. Pure: the planner may size a pass more than once. `slots_short`:
        short requests lack running slots (`pass_budget.slots_short`): no long prefill beyond the floor. A pass that
        admits short requests carries at most `admit_pass_long_tokens` document tokens (a constant cap on a size
        that is non-decreasing in each target keeps it so)."""
        size = self._size(cfg, cost, load, slots_short)
        cap = cfg.admit_pass_long_tokens
        if load.short_tokens and cap is not None and size.long_tokens > cap:
            return PassSize(cap, SizedBy.ADMIT_CAP, size.bound_s, size.missed, size.minimal_s)
        return size

    def _size(self, cfg: PolicyConfig, cost: PassCost, load: PassLoad, slots_short: bool) -> PassSize:
        floor = long_floor_tokens(cfg, load)

        rows, rows_ctx = load.riding
        work = attention_of(cost)
        charge = charge_of(cost)

        def seconds(long_tokens: int) -> float:
            pairs = load.short_ctx_pairs + extend_pairs(work, load.long_ctx_tokens, long_tokens)
            return charge * predict(cost, load.short_tokens + long_tokens, pairs, rows, rows_ctx)

        bounds = self.bounds(cfg, cost, load, charge)
        tightest = min(bounds, key=lambda b: b.seconds)
        if slots_short:
            return PassSize(floor, SizedBy.SLOTS, tightest.seconds)
        if load.output_lag_passes and self.admitted_short and not load.short_tokens:
            # The last pass's first tokens leave once this one has run: it is the minimal pass.
            return PassSize(floor, SizedBy.OUTPUT, tightest.seconds)
        minimal_s = seconds(floor)
        missed = tuple(dict.fromkeys(b.target for b in bounds if minimal_s > b.seconds))
        if missed:
            # The pass may spend on documents up to `missed_pass_stretch` x what the floor already costs it: where a
            # document's presence costs most of the pass (deep padded attention on CPU: the causal square whatever
            # the chunk), it carries thousands of tokens instead of crawling; with linear costs, a few more than the
            # floor. A chat's own pass (no floor) stays minimal.
            tokens = floor
            if floor:
                base_s = seconds(0)
                allowed_s = base_s + cfg.missed_pass_stretch * (minimal_s - base_s)
                tokens = largest_within(allowed_s, floor, load.limit_long_tokens, seconds)
            return PassSize(tokens, tightest.by, tightest.seconds, missed, minimal_s)
        tokens = largest_within(tightest.seconds, floor, load.limit_long_tokens, seconds)
        if cfg.pass_throughput_slack is not None:
            knee = throughput_knee(cfg.pass_throughput_slack, floor, tokens, seconds, loop_overhead_of(cost))
            if knee < tokens:
                return PassSize(knee, SizedBy.THROUGHPUT, tightest.seconds, minimal_s=minimal_s)
        by = SizedBy.CHUNK if tokens == load.limit_long_tokens else tightest.by
        return PassSize(tokens, by, tightest.seconds, minimal_s=minimal_s)

    def own_pass_s(self, cost: PassCost, charge: float, rows: int = 0, rows_ctx: int = 0) -> float:
        """The chat's own pass the TTFT bound leaves room for: one admitting a chat of `ChatPrompts.reserve_tokens`
        beside `rows` decoding streams riding (contexts summed `rows_ctx`), charged `charge` times its prediction;
        `UnusableCost` when the model cannot predict it."""
        reserve = self.chat_prompts.reserve_tokens
        return charge * predict(cost, reserve, chunk_ctx_pairs(0, reserve), rows, rows_ctx)

    def arrival_own_pass_s(self, cost: PassCost | None) -> float | None:
        """`own_pass_s` for a chat arriving at an engine with no streams decoding, charged with the model's stated
        error; None without a model or when it cannot predict (the engine then sizes passes with the static knobs)."""
        if cost is None:
            return None
        try:
            return self.own_pass_s(cost, charge_of(cost))
        except UnusableCost:
            return None

    def bounds(self, cfg: PolicyConfig, cost: PassCost, load: PassLoad, charge: float) -> list[_Bound]:
        """The most seconds this pass may last, for each target that bounds it; every other pass they leave room for
        is predicted, and charged `charge` times its prediction (`charge_of`)."""
        ahead = 1 + load.admission_lag_passes
        own_s = self.own_pass_s(cost, charge, *load.riding)
        # Without mixed decode, short streams are owed a decode-only pass after each prefill pass: a chat that
        # arrives during this pass waits for it too, and so does each stream's next token.
        decode_pass_s = 0.0
        if load.num_short_decoding and not load.rows_ride:
            decode_pass_s = charge * predict(cost, 0, 0.0, load.num_decoding, load.decode_ctx_tokens)
        # The passes a chat's first token waits for after its own (`output_lag_passes`) are each kept as short as it.
        after_s = load.output_lag_passes * own_s
        in_flight_s = in_flight_bound_s(
            cfg.planned_ttft_s, own_s, load.admission_lag_passes, load.output_lag_passes, decode_pass_s
        )
        bounds = [_Bound(in_flight_s, SizedBy.TTFT, Target.TTFT)]
        if load.short_tokens:
            waited_pass_s = self.last_pass_s if self.queued_s is None else self.queued_s
            if waited_pass_s is None:
                # They waited the in-flight bound `ahead` times: what is left is their own pass (and the decode-only
                # passes), computed so, not as a difference from the target (which rounds with the target).
                left_s = own_s + ahead * decode_pass_s
            else:
                left_s = cfg.planned_ttft_s - ahead * charge * waited_pass_s - after_s
            bounds.append(_Bound(left_s, SizedBy.ADMIT, Target.TTFT))
        if load.num_short_decoding:
            bounds.append(_Bound(cfg.planned_tbt_s - decode_pass_s, SizedBy.TBT, Target.TBT))
        return bounds

    def commit(self, predicted_s: float | None, short_prompt_tokens: list[int], short_left_waiting: bool) -> None:
        if not short_left_waiting:
            self.queued_s = None
        else:  # unpredicted passes (no model) count as nothing: the bound then trusts the last predicted ones
            before = (self.last_pass_s or 0.0) if self.queued_s is None else self.queued_s
            self.queued_s = before + (predicted_s or 0.0)
        self.last_pass_s = predicted_s
        self.admitted_short = bool(short_prompt_tokens)
        self.chat_prompts.record(short_prompt_tokens)


@dataclass
class SloCounters:
    """Passes the controller could not size as asked, for engines to export (the planner's `slo_counters`)."""

    sized_passes: int = 0
    """Passes the controller sized (committed plans): what the counts below are a share of."""
    missed_passes: dict[Target, int] = field(default_factory=lambda: dict.fromkeys(Target, 0))
    """Passes in which even the minimal pass breaks the target: the hardware cannot meet it there."""
    slot_passes: int = 0
    """Passes sized down because short requests lacked running slots (`pass_budget.slots_short`)."""
    unusable_cost_passes: int = 0
    """Passes the static knobs sized because the cost model could not predict them."""
    _warned: set[str] = field(default_factory=set)

    def record(self, cfg: PolicyConfig, size: PassSize, unusable: str | None) -> None:
        """Count one committed pass; the first of each kind of failure is logged."""
        self.sized_passes += 1
        self.slot_passes += size.by is SizedBy.SLOTS
        for target in size.missed:
            self.missed_passes[target] += 1
            goal = cfg.ttft_target_s if target is Target.TTFT else cfg.tbt_target_s
            self._warn_once(
                target.value,
                f"fairshare: the {target.value} target {goal:g} s cannot be met: the smallest pass the policy can "
                f"plan is predicted at {size.minimal_s:.3f} s against a bound of {size.bound_s:.3f} s; such passes "
                f"are the smallest, and counted (missed_passes)",
            )
        if unusable is not None:
            self.unusable_cost_passes += 1
            self._warn_once("cost", f"fairshare: {unusable}; the static pass knobs size such passes")

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)
