"""Decode interleave: which kind of pass runs next.

sglang's default keeps mixed chunk off: a prefill pass carries no decoding rows, so a chat that is
decoding beside a document would stall for every pass of the document's prefill. With
`short_decode_interleave`, a decode-only pass follows each prefill pass while short requests'
streams decode: their inter-token gap is one prefill pass plus one decode step, whatever the
document's length. (`decode_steps_per_prefill` is sglang's own interval, for every stream.)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from scheduler.config import PolicyConfig


class PassKind(Enum):
    PREFILL = "prefill"  # prefill only: decoding streams wait (sglang's default)
    MIXED = "mixed"  # prefill with decoding streams riding along
    DECODE = "decode"
    IDLE = "idle"


def short_decode_passes(cfg: PolicyConfig, num_short_decoding: int) -> int:
    """Decode-only passes owed after a prefill pass for the sake of short streams (0 or 1)."""
    return int(cfg.short_decode_interleave and not cfg.mixed_decode and num_short_decoding > 0)


@dataclass
class DecodeInterleave:
    """Mixed or prefill-only passes, then the decode-only passes owed after each prefill pass."""

    decode_passes_owed: int = 0

    def decode_due(self, num_decoding: int) -> bool:
        """True when this pass must be decode-only (checked before planning any prefill)."""
        if num_decoding and self.decode_passes_owed > 0:
            self.decode_passes_owed -= 1
            return True
        return False

    def after_prefill(self, owed: int) -> None:
        self.decode_passes_owed = owed

    def next_kind(self, cfg: PolicyConfig, has_prefill: bool, num_decoding: int, num_short_decoding: int) -> PassKind:
        if has_prefill:
            self.after_prefill(max(cfg.decode_steps_per_prefill, short_decode_passes(cfg, num_short_decoding)))
            return PassKind.MIXED if cfg.mixed_decode and num_decoding else PassKind.PREFILL
        return PassKind.DECODE if num_decoding else PassKind.IDLE
