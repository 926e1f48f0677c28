"""Small factories for policy-core tests."""

from __future__ import annotations

from scheduler.config import PolicyConfig
from scheduler.snapshot import Candidate, QueueSnapshot

FCFS = dict(skip_ahead=False, fair_share=False, adaptive_pass=False, interactive_reserve=False)


def cand(rid: str, extend: int, need: int | None = None) -> Candidate:
    return Candidate(rid, extend, extend + 16 if need is None else need)


def snap(waiting, free_kv=1_000_000, slots=64, continuing=(), **kw) -> QueueSnapshot:
    return QueueSnapshot(
        waiting=list(waiting), free_kv_tokens=free_kv, free_running_slots=slots, continuing=list(continuing), **kw
    )


def cfg(**kw) -> PolicyConfig:
    return PolicyConfig(**kw)
