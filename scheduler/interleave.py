"""Decode interleave: which kind of pass runs next."""

from __future__ import annotations

from enum import Enum

from scheduler.config import PolicyConfig


class PassKind(Enum):
    PREFILL = "prefill"  # prefill only: decoding streams wait (sglang's default)
    MIXED = "mixed"  # prefill with decoding streams riding along
    DECODE = "decode"
    IDLE = "idle"


def next_pass_kind(cfg: PolicyConfig, has_prefill: bool, num_decoding: int, decode_passes_owed: int) -> PassKind:
    """`decode_passes_owed`: decode-only passes still due after the last prefill pass."""
    if num_decoding and decode_passes_owed > 0:
        return PassKind.DECODE
    if has_prefill:
        return PassKind.MIXED if cfg.mixed_decode and num_decoding else PassKind.PREFILL
    return PassKind.DECODE if num_decoding else PassKind.IDLE
