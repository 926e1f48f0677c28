"""How big the next forward pass may be.

A pass in flight cannot be interrupted, so its size trades a lone document's prefill speed
(big passes amortise the fixed cost per pass) against the wait of the next short arrival (it
waits for the rest of the pass in flight) and the inter-token latency of streams that are
decoding (they ride in the pass). While interactive traffic is active — a short request was
admitted in the last `activity_window_passes` passes, or a short request's stream is decoding —
passes stay at `interactive_pass_tokens`; otherwise they may grow to `quiet_pass_tokens`. The pass
that admits a short request holds it plus at most `short_pass_extra_tokens` of long prefill, so
its first token comes after one nearly empty pass.

Counted in passes, not seconds: every tensor-parallel rank must take the same decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.config import PolicyConfig


@dataclass
class PassSizer:
    passes_since_short: int | None = None
    """Passes since a short request was last admitted; None = never."""

    def next_budget(
        self, cfg: PolicyConfig, short_admitted_tokens: int, num_decoding: int, num_short_decoding: int
    ) -> int:
        """`short_admitted_tokens`: prefill tokens of the short requests admitted this pass."""
        if short_admitted_tokens:
            self.passes_since_short = 0
        elif self.passes_since_short is not None:
            self.passes_since_short += 1
        budget = cfg.chunk_budget_tokens
        if cfg.adaptive_pass:
            recent = self.passes_since_short is not None and self.passes_since_short <= cfg.activity_window_passes
            if short_admitted_tokens:
                budget = min(budget, short_admitted_tokens + cfg.short_pass_extra_tokens)
            elif recent or num_short_decoding:
                budget = cfg.interactive_pass_tokens
            elif cfg.quiet_pass_tokens is not None:
                budget = cfg.quiet_pass_tokens
        if num_decoding and cfg.mixed_decode:
            budget -= num_decoding  # sglang's mixed chunk: each decoding row takes a token of the budget
        return max(1, budget)
