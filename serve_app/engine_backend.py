"""The one interface every engine backend implements, and the records that cross it.

A backend lives inside one engine replica. The replica hands it a `GenerateRequest` and relays
what `generate` yields (`Chunk`s) to the ingress as they are, across the process boundary; a
request the engine refuses or aborts for a reason the client should hear ends its stream with one
`EngineError` (the backend raises `RequestError`, the replica turns it into the record). On client
disconnect the replica's task is cancelled and the backend must drop the request from its queue
and free its KV (`abort`). `load()` is what the replica publishes to routers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from scheduler.config import PolicyConfig
from scheduler.traffic import TrafficClass
from serve_app.config import EngineKnobs

FinishReason = Literal["stop", "length"]


class RequestError(Exception):
    """The engine refused or aborted a request for a reason the client should hear (e.g. it can never fit in
    KV, sglang aborted it). Any other exception from a backend is a bug: a 500, never a 4xx."""

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
    prompt_token_ids: list[int] | None = None
    """Set when the ingress tokenized with the model's tokenizer (sglang); the sim counts only."""
    stop: tuple[str, ...] = ()
    temperature: float = 1.0
    traffic_class: TrafficClass = TrafficClass.SHORT
    """The router's class for this request, for metrics and the sim's records."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """What a stream yields: the tokens ready now, coalesced (one Ray item per chunk, not per token)."""

    text: str = ""
    num_tokens: int = 0
    """Output tokens this chunk carries."""
    cached_tokens: int | None = None
    """Set on a stream's first chunk: prompt tokens served from the session's prefix cache."""
    finish_reason: FinishReason | None = None
    """Set on a stream's last chunk."""
    completion_tokens: int = 0
    """Output tokens so far, this chunk included."""


@dataclass(frozen=True, slots=True)
class EngineError:
    """The last item of a stream the engine ended in error: an HTTP status and a message for the client."""

    status: int
    message: str
    code: str | None = None
    """OpenAI's error code, e.g. `rate_limit_exceeded` (None: the status says enough)."""
    retry_after_s: int | None = None
    """Sent as `Retry-After` (backpressure)."""


@dataclass(frozen=True, slots=True)
class ResponseStart:
    """First item of an OpenAI response written by the engine itself (sglang's serving classes): the status and
    the media type (`application/json`, or `text/event-stream` for a stream). `ResponseBody` items follow."""

    status: int
    media_type: str


@dataclass(frozen=True, slots=True)
class ResponseBody:
    """Bytes of an engine-written response, passed to the client as they are (SSE events or a JSON body)."""

    data: bytes


StreamItem = Chunk | EngineError
"""What the engine replica streams to the ingress (sim backend)."""

ResponseItem = ResponseStart | ResponseBody | EngineError
"""What the engine replica streams to the ingress when the engine writes the OpenAI response (sglang backend);
an `EngineError` first means the replica refused the request (backpressure) before the engine saw it."""


def joined_bodies(items: list[ResponseItem]) -> list[ResponseItem]:
    """`items` with each run of consecutive `ResponseBody`s joined into one (the same bytes, fewer stream items)."""
    out: list[ResponseItem] = []
    run: list[bytes] = []
    for item in items:
        if isinstance(item, ResponseBody):
            run.append(item.data)
            continue
        if run:
            out.append(ResponseBody(b"".join(run)))
            run = []
        out.append(item)
    if run:
        out.append(ResponseBody(b"".join(run)))
    return out


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """A replica's load as routers see it (published through `record_routing_stats`)."""

    num_waiting: int = 0
    """Requests not yet admitted by the engine scheduler."""
    num_prefilling: int = 0
    """Admitted, prompt not fully prefilled."""
    num_decoding: int = 0
    prefill_tokens: int = 0
    """Uncached prompt tokens still to prefill, waiting and prefilling requests together."""
    max_running_requests: int = 0
    kv_used_tokens: int = 0
    kv_total_tokens: int = 0
    ready: bool = True
    """The engine is up. A replica whose engine is loading or restarting publishes False and gets no request."""
    prefill_tok_per_s: float = 0.0
    """The engine's prefill rate, uncached tokens per second of prefill work (0: not known)."""
    pass_fixed_s: float = 0.0
    """What a forward pass costs beyond its tokens (0 when the rate already includes it)."""
    pass_tokens: int = 0
    """Most prefill tokens in the pass a request arriving now may have to wait for (the pass in flight)."""
    interactive_pass_tokens: int = 0
    """The smaller pass the engine runs while short requests are pending or decoding (0: it has none)."""
    short_first: bool = False
    """A short request rides the engine's next pass, ahead of queued prefill (the policy's fair share); without
    it (upstream sglang) every prefill token queued before it goes first."""

    @property
    def num_pending(self) -> int:
        """Requests that have not produced their first token."""
        return self.num_waiting + self.num_prefilling

    def to_dict(self) -> dict[str, int | float | bool]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> ReplicaLoad:
        d = d or {}
        defaults = cls()
        # Each field parsed as its default's type; a field a replica did not publish keeps the default.
        return cls(**{f: type(getattr(defaults, f))(d.get(f, getattr(defaults, f))) for f in cls.__dataclass_fields__})


@dataclass
class EngineCounters:
    """Monotonic counts a backend keeps for metrics and the admin view."""

    num_finished: int = 0
    num_aborted: int = 0
    num_skip_ahead: int = 0
    """Requests admitted ahead of an earlier request rejected for KV capacity."""


class EngineBackend(Protocol):
    model_id: str

    async def start(self) -> None:
        """Bring the engine up (called once, inside the replica's event loop)."""

    def generate(self, request: GenerateRequest) -> AsyncIterator[Chunk]:
        """Yields `Chunk`s: the first has `cached_tokens`, the last `finish_reason`. Raises `RequestError` when
        the engine refuses or aborts the request. Cancelling the iteration aborts the request."""
        ...

    def abort(self, rid: str) -> bool:
        """Drop a request from the queue and free its KV. False if unknown or already done."""
        ...

    def load(self) -> ReplicaLoad: ...

    def reconfigure(self, knobs: EngineKnobs) -> None:
        """Apply knobs; raise `ConfigError` on a bad value, leaving the old ones in force. Called before `start`
        (the replica's first `user_config`) and on every live change."""
        ...

    async def restart_if_needed(self) -> bool:
        """Restart the engine if the last `reconfigure` changed something it reads only at start (sglang's policy);
        True when it did. Called by the replica right after `reconfigure`."""
        ...

    @property
    def policy(self) -> PolicyConfig:
        """The scheduler policy in force (routers classify traffic with its `short_request_tokens`)."""
        ...

    def recent_sessions(self, limit: int) -> dict[str, int]:
        """Cached tokens of the `limit` most recently used sessions (published to routers)."""
        ...

    def pending_requests(self, limit: int) -> dict[str, int]:
        """Up to `limit` requests without a first token yet: id -> uncached prompt tokens still to prefill."""
        ...

    def counters(self) -> EngineCounters: ...

    def describe(self) -> dict[str, Any]:
        """Admin view: active policy, active request ids, KV."""
        ...

    async def shutdown(self) -> None: ...
