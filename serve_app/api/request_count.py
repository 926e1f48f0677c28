"""Each request counted once in `fairshare_requests_total`, with the status it was answered with."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from serve_app.metrics import IngressMetrics
from serve_app.protocol.errors import OpenAIError


class Outcome:
    """The status a request is counted with, set as it is answered."""

    STREAMING = "streaming"
    """Handed to a response stream, which counts the request itself when it ends."""

    def __init__(self, status: str) -> None:
        self.status = status

    @property
    def handed_over(self) -> bool:
        return self.status == self.STREAMING


@contextlib.contextmanager
def counting(metrics: IngressMetrics, endpoint: str, unfinished: str = "500") -> Iterator[Outcome]:
    """Count one request once: with the status the block set, an `OpenAIError`'s status, 499 when the client went
    away (the task cancelled), else `unfinished` (500 for a handler: a bug; 499 for a stream closed early)."""
    outcome = Outcome(unfinished)
    try:
        yield outcome
    except OpenAIError as e:
        outcome.status = str(e.status)
        raise
    except asyncio.CancelledError:
        outcome.status = "499"
        raise
    finally:
        if not outcome.handed_over:
            metrics.requests.inc(tags={"endpoint": endpoint, "status": outcome.status})
