"""Decode interleave: which kind of pass runs next."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from scheduler.config import PolicyConfig


class PassKind(Enum):
    PREFILL = "prefill"  # prefill only: decoding streams wait (sglang's default)
    MIXED = "mixed"  # prefill with decoding streams riding along
    DECODE = "decode"
    IDLE = "idle"


@dataclass
class DecodeInterleave:
    """Mixed or prefill-only passes, and `decode_steps_per_prefill` decode-only passes after each prefill pass."""

    decode_passes_owed: int = 0

    def decode_due(self, num_decoding: int) -> bool:
        """True when this pass must be decode-only (checked before planning any prefill)."""
        if num_decoding and self.decode_passes_owed > 0:
            self.decode_passes_owed -= 1
            return True
        return False

    def next_kind(self, cfg: PolicyConfig, has_prefill: bool, num_decoding: int) -> PassKind:
        if has_prefill:
            self.decode_passes_owed = cfg.decode_steps_per_prefill
            return PassKind.MIXED if cfg.mixed_decode and num_decoding else PassKind.PREFILL
        return PassKind.DECODE if num_decoding else PassKind.IDLE
