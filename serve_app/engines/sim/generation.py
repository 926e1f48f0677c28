"""The simulated engine's own request and output: what `SimBackend.generate` takes and streams.

`serving` turns an OpenAI request into a `GenerateRequest` and the `Chunk`s back into OpenAI's response.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.traffic import TrafficClass
from serve_app.protocol.openai_models import FinishReason


class RequestError(Exception):
    """The engine refused or aborted a request for a reason the client should hear (it can never fit in KV).
    Any other exception from the engine is a bug: a 500, never a 4xx."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    rid: str
    prompt_text: str
    prompt_tokens: int
    max_tokens: int
    session_id: str | None = None
    stop: tuple[str, ...] = ()
    traffic_class: TrafficClass = TrafficClass.SHORT
    """The router's class for this request, for the engine's records."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """What a stream yields: the tokens ready now, coalesced (one chunk per look, not per token)."""

    text: str = ""
    num_tokens: int = 0
    """Output tokens this chunk carries."""
    cached_tokens: int | None = None
    """Set on a stream's first chunk: prompt tokens served from the session's prefix cache."""
    finish_reason: FinishReason | None = None
    """Set on a stream's last chunk."""
    completion_tokens: int = 0
    """Output tokens so far, this chunk included."""
