"""Work on a long prompt leaves the event loop; a short one's stays on it."""

from __future__ import annotations

import asyncio
import math
import threading

from serve_app.off_loop import MIN_OFF_LOOP_TOKENS, off_loop


def _where(label: str) -> tuple[str, int]:
    return label, threading.get_ident()


def test_a_long_prompt_is_worked_on_a_worker_thread_and_a_short_one_inline() -> None:
    async def go() -> list[bool]:
        loop_thread = threading.get_ident()
        on = []
        for size in (1, MIN_OFF_LOOP_TOKENS - 1, MIN_OFF_LOOP_TOKENS, math.inf):
            label, thread = await off_loop(size, _where, label=str(size))
            assert label == str(size)
            on.append(thread != loop_thread)
        return on

    assert asyncio.run(go()) == [False, False, True, True]
