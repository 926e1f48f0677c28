"""CPU work on a long prompt runs on a worker thread, not on the event loop of the sim replica that has it.

A sim replica's event loop runs its engine loop and serves every stream of the replica: 20-30 ms of tokenizing or
hashing a 100k-token document inline delays every chat's next token by that much, past a time-between-tokens
target the passes are sized to keep. On a worker thread the loop gets the interpreter back within its switch
interval (5 ms). Short prompts stay inline: a thread hop costs more than their work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

MIN_OFF_LOOP_TOKENS = 8192
"""Prompts of at least this many tokens are worked on a worker thread."""


async def off_loop(size_tokens: float, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """`fn(*args, **kwargs)`, on a worker thread when the prompt it works on has `size_tokens` or more."""
    if size_tokens >= MIN_OFF_LOOP_TOKENS:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)
