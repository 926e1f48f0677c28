"""How long one forward pass takes, on a virtual clock.

    compute = prefill_tokens / prefill_tok_per_s
            + attn_s_per_token_ctx * (sum over prefill tokens of the context each attends to)
            + decode_rows * decode_row_s
            + attn_s_per_token_ctx * (sum of the decoding rows' contexts)
    pass_s  = (fixed_s ** p + compute ** p) ** (1 / p)

With ``overlap_p = 1`` this is the plain sum "fixed cost + token work". A larger p says the
per-pass fixed work (scheduling, launches, all-reduce latency) partly overlaps with compute, as it
does under sglang's overlap scheduler; the article's fit prefers p near 2 (see `calibration`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CostModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    fixed_s: float = Field(ge=0, description="Per-pass fixed cost.")
    prefill_tok_per_s: float = Field(gt=0, description="Linear-layer prefill rate, attention excluded.")
    decode_row_s: float = Field(ge=0, description="Cost of one decoding row in a pass.")
    attn_s_per_token_ctx: float = Field(ge=0, description="Attention cost per (token, context token) pair.")
    overlap_p: float = Field(1.0, ge=1.0, description="p-norm combining fixed cost and compute (1 = sum).")
    kv_pool_tokens: int = Field(gt=0, description="KV cache size in tokens.")
    notes: str = ""

    def pass_s(self, prefill_tokens: int, prefill_ctx_pairs: float, decode_rows: int, decode_ctx_tokens: int) -> float:
        if prefill_tokens == 0 and decode_rows == 0:
            return 0.0
        compute = (
            prefill_tokens / self.prefill_tok_per_s
            + self.attn_s_per_token_ctx * (prefill_ctx_pairs + decode_ctx_tokens)
            + decode_rows * self.decode_row_s
        )
        p = self.overlap_p
        return float((self.fixed_s**p + compute**p) ** (1.0 / p))

    def pass_efficiency(self, tokens: int) -> float:
        """Prefill speed of passes of `tokens` tokens relative to one unbounded pass (attention aside)."""
        compute = tokens / self.prefill_tok_per_s
        return compute / self.pass_s(tokens, 0.0, 0, 0)

    def tokens_for_efficiency(self, target: float, granule: int = 256) -> int:
        """The smallest multiple of `granule` whose passes reach `target` efficiency."""
        tokens = granule
        while self.pass_efficiency(tokens) < target:
            tokens += granule
        return tokens

    def tokens_within(self, pass_s: float, granule: int = 128) -> int:
        """The largest multiple of `granule` (at least one granule) whose prefill pass lasts at most `pass_s`."""
        tokens = granule
        while self.pass_s(tokens + granule, 0.0, 0, 0) <= pass_s:
            tokens += granule
        return tokens

    def decode_step_s(self, rows: int, mean_ctx_tokens: int) -> float:
        return self.pass_s(0, 0.0, rows, rows * mean_ctx_tokens)
