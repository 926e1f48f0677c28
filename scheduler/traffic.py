"""Traffic classes: the one test of what is a short (interactive) request and what is a long document.

The planner (which requests get small passes and reservations) and the Serve router (which lane a
request takes) both call `classify`, with the same knob, `PolicyConfig.short_request_tokens`.
"""

from __future__ import annotations

from enum import StrEnum


class TrafficClass(StrEnum):
    LONG = "long"
    SHORT = "short"


def classify(
    uncached_prompt_tokens: int,
    short_request_tokens: int,
    previous: TrafficClass | None = None,
    hysteresis: float = 0.0,
) -> TrafficClass:
    """SHORT when at most `short_request_tokens` prompt tokens are uncached, else LONG.

    A request of a session last classed LONG stays LONG until its uncached prompt falls to
    `short_request_tokens * (1 - hysteresis)`, so a session near the threshold does not flip.
    """
    threshold = short_request_tokens
    if previous is TrafficClass.LONG:
        threshold = int(threshold * (1 - hysteresis))
    return TrafficClass.SHORT if uncached_prompt_tokens <= threshold else TrafficClass.LONG
