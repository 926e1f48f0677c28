"""How big the next forward pass may be.

A pass in flight cannot be interrupted, so its size trades a lone document's prefill speed
(big passes amortise the fixed cost per pass) against the wait of the next short arrival (it
waits for the rest of the pass in flight) and the inter-token latency of streams that are
decoding (they ride in the pass, or wait for it). While interactive traffic is active — a short
request was admitted in the last `activity_window_passes` forward passes, or a short request's
stream is decoding — passes stay at `interactive_pass_tokens`; otherwise they may grow to
`quiet_pass_tokens`. The pass that admits a short request holds it plus at most
`short_pass_extra_tokens` of long prefill, so its first token comes after one nearly empty pass.

With mixed decode, each decoding row takes one token of the *chunk* budget, as sglang's mixed chunk
does (`PrefillAdder` starts from ``chunked_prefill_size - running_bs``), not of the smaller pass the
policy chose: a pass never shrinks below what it would be without decode rows unless the rows
leave less than that of the whole chunk, so short admissions are never starved by decoding streams.

Counted in forward passes, the engine's own counter (sglang's ``forward_ct``, the simulator's
step count), not seconds: every tensor-parallel rank must take the same decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.config import PolicyConfig


@dataclass
class PassSizer:
    last_short_pass: int | None = None
    """Forward-pass index of the last pass that admitted a short request; None = never."""

    def budget(
        self,
        cfg: PolicyConfig,
        pass_index: int,
        short_admitted_tokens: int,
        num_decoding: int,
        num_short_decoding: int,
    ) -> int:
        """The pass budget; pure (the planner may size a pass more than once before committing it).
        `short_admitted_tokens`: prefill tokens of the short requests admitted this pass."""
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
        if num_decoding and cfg.mixed_decode:
            # sglang's mixed chunk: decode rows come out of the chunk budget, not out of a smaller pass.
            budget = min(budget, cfg.chunk_budget_tokens - num_decoding)
        return max(1, budget)

    def commit(self, pass_index: int, short_admitted_tokens: int) -> None:
        if short_admitted_tokens:
            self.last_short_pass = pass_index
