"""What a forward pass costs: the one interface every pass-cost model answers.

The simulator's presets (`scheduler.sim.cost_model.CostModel`) and the cost model fitted online from an
engine's measured passes both answer `pass_s`; the policy sizes passes from whichever the engine gives it.
A pass's cost depends on its prefill tokens, the context those tokens attend to, and the decoding rows riding
along with their contexts.
"""

from __future__ import annotations

from typing import Protocol


class PassCost(Protocol):
    def pass_s(self, prefill_tokens: int, prefill_ctx_pairs: float, decode_rows: int, decode_ctx_tokens: int) -> float:
        """Seconds one forward pass takes. `prefill_ctx_pairs`: the attention pairs of its prefill chunks
        (`chunk_ctx_pairs` summed over them); `decode_ctx_tokens`: the decoding rows' contexts, summed."""
        ...


def chunk_ctx_pairs(start: int, tokens: int) -> float:
    """Attention pairs for prefilling tokens [start, start + tokens): each attends to its prefix."""
    return tokens * start + tokens * (tokens + 1) / 2
