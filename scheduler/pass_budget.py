"""How big the next forward pass may be.

A pass in flight cannot be interrupted, so its size trades a document's prefill speed (big passes amortise the
fixed cost per pass) against the wait of the next short arrival (it waits for the rest of the pass in flight)
and the time between tokens of streams that are decoding (they ride in the pass, or wait for it).

By default (`slo_sizing`) the pass is the largest that the engine's pass-cost model predicts keeps the
interactive targets, ``ttft_target_s`` and ``tbt_target_s`` (`scheduler.slo_sizing`). Without a usable model, or
with SLO sizing off, the static knobs size it: while interactive traffic is active — a short request was admitted
in the last `activity_window_passes` forward passes, or a short request's stream is decoding — passes stay at
`interactive_pass_tokens`; otherwise they may grow to `quiet_pass_tokens`. The pass that admits a short request
holds it plus at most `short_pass_extra_tokens` of long prefill, so its first token comes after one nearly empty
pass.

Either way (unless `slot_aware_passes` is off), while short requests lack running slots (`slots_short`) the pass
carries no long prefill beyond the documents' floor (`long_pass_floor_tokens`). A stream holds its slot for as
many passes as it has tokens, so bigger passes keep more streams decoding at once; past the slot limit each new
chat waits for a stream to finish, and at big passes that took seconds (the cliff of static passes of 1,024-2,048
tokens on h100-8b's bursts: `benchmarks/pass_size_cliff.py`). Small passes while slots are short make the streams
finish at decode speed and give slots back.

With mixed decode, each decoding row takes one token of the *chunk* budget, as sglang's mixed chunk does
(`PrefillAdder` starts from ``chunked_prefill_size - running_bs``), not of the smaller pass the policy chose: a
pass never shrinks below what it would be without decode rows unless the rows leave less than that of the whole
chunk, so short admissions are never starved by decoding streams. A pass budget is never below one token.

Counted in forward passes, the engine's own counter (sglang's ``forward_ct``, the simulator's step count), not
seconds: every tensor-parallel rank must take the same decisions (a cost model the controller reads must then be
the same on every rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.config import PolicyConfig
from scheduler.pass_cost import PassCost
from scheduler.slo_sizing import PassLoad, PassSize, SizedBy, SloSizer, UnusableCost, long_floor_tokens


@dataclass(frozen=True, slots=True)
class PassBudget:
    tokens: int
    """Prefill tokens the pass may carry, short requests included."""
    size: PassSize
    unusable_cost: str | None = None
    """Why the cost model could not size this pass (the static knobs did)."""


@dataclass
class PassSizer:
    last_short_pass: int | None = None
    """Forward-pass index of the last pass that admitted a short request; None = never."""
    slo: SloSizer = field(default_factory=SloSizer)

    def budget(
        self,
        cfg: PolicyConfig,
        pass_index: int,
        short_admitted_tokens: int,
        num_decoding: int,
        num_short_decoding: int,
    ) -> int:
        """The static knobs' pass budget; pure (the planner may size a pass more than once before committing
        it). `short_admitted_tokens`: prefill tokens of the short requests admitted this pass."""
        budget = cfg.chunk_budget_tokens
        if cfg.adaptive_pass:
            recent = (
                self.last_short_pass is not None and pass_index - self.last_short_pass <= cfg.activity_window_passes
            )
            if short_admitted_tokens:
                budget = min(budget, short_admitted_tokens + cfg.short_pass_extra_tokens)
            elif recent or num_short_decoding:
                budget = cfg.interactive_pass_tokens
            elif cfg.quiet_pass_tokens is not None:
                budget = cfg.quiet_pass_tokens
        return _within_chunk(cfg, budget, num_decoding)

    def size(self, cfg: PolicyConfig, cost: PassCost | None, load: PassLoad, pass_index: int) -> PassBudget:
        """This pass's budget, from the targets and `cost` when SLO sizing can, else from the static knobs; pure."""
        if not load.short_tokens and not load.num_long_sharers:  # nobody to prefill: nothing to size
            tokens = self.budget(cfg, pass_index, 0, load.num_decoding, load.num_short_decoding)
            return PassBudget(tokens, PassSize(tokens, SizedBy.IDLE))
        if cfg.adaptive_pass and cfg.slo_sizing and cost is not None:
            try:
                size = self.slo.size(cfg, cost, load, slots_short(cfg, load))
            except UnusableCost as exc:
                return self._static(cfg, load, pass_index, unusable=str(exc))
            return PassBudget(_within_chunk(cfg, load.short_tokens + size.long_tokens, load.num_decoding), size)
        return self._static(cfg, load, pass_index)

    def _static(self, cfg: PolicyConfig, load: PassLoad, pass_index: int, unusable: str | None = None) -> PassBudget:
        if cfg.adaptive_pass and slots_short(cfg, load):
            floor = long_floor_tokens(cfg, load)
            tokens = _within_chunk(cfg, load.short_tokens + floor, load.num_decoding)
            return PassBudget(tokens, PassSize(floor, SizedBy.SLOTS), unusable)
        tokens = self.budget(cfg, pass_index, load.short_tokens, load.num_decoding, load.num_short_decoding)
        return PassBudget(tokens, PassSize(tokens - load.short_tokens, SizedBy.STATIC), unusable)

    def commit(
        self, pass_index: int, short_admitted_tokens: list[int], predicted_s: float | None, short_left_waiting: bool
    ) -> None:
        if short_admitted_tokens:
            self.last_short_pass = pass_index
        self.slo.commit(predicted_s, short_admitted_tokens, short_left_waiting)


def slots_short(cfg: PolicyConfig, load: PassLoad) -> bool:
    """Do short requests lack running slots that small passes would free? Short streams decoding hold more than
    the interactive reserve of slots, and a short request waits for one or no more than the reserve is free (the
    next arrivals may find none). A decoding stream gives its slot back after its remaining tokens, one a pass, so
    small passes free one soon. Where long requests hold the slots and the short streams only their reserve, small
    passes would just delay the documents' slots: passes keep their size."""
    if not cfg.slot_aware_passes:
        return False
    reserve = cfg.reserved_slots
    if load.num_short_decoding <= reserve:
        return False
    return load.short_waits_for_slot or load.free_running_slots <= reserve


def _within_chunk(cfg: PolicyConfig, budget: int, num_decoding: int) -> int:
    """Every pass within sglang's chunk: a short prompt (up to short_request_tokens) may alone exceed it. With
    sglang's mixed chunk the decode rows come out of the chunk budget, not out of a smaller pass."""
    rows = num_decoding if cfg.mixed_decode else 0
    return max(1, min(budget, cfg.chunk_budget_tokens - rows))
