"""The one interface every engine backend implements, and the records that cross it.

A backend lives inside one engine replica. The replica hands it an `OpenAIRequest` (the client's body as it
came, and what routing knows) and relays what `respond` yields to the ingress as it is: the OpenAI response
the backend wrote, as `ResponseStart` (status, media type) and `ResponseBody` bytes (JSON, or SSE events
ending with `data: [DONE]`). Each yielded list is what is ready together; it crosses to the ingress as one
stream item. sglang's backend has sglang's own serving classes write it; the sim backend writes it from its
engine's chunks. Errors are part of the response: a request the engine refuses is an error response (status
and OpenAI's error body); an error after a stream started is an SSE error event, then `[DONE]`, in a body
that names its status (`error_status`). The replica's own refusal (backpressure, before the backend sees the
request) is the one other item: `EngineError`. Closing the iteration early (the client went away: the
replica's task is cancelled) must abort the request in the engine, freeing its queue slot and KV.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from scheduler.config import PolicyConfig
from scheduler.tenants import DEFAULT_TENANT
from scheduler.traffic import TrafficClass
from serve_app.config import EngineKnobs
from serve_app.protocol.errors import OpenAIError
from serve_app.protocol.sse import output_events

EngineKind = Literal["chat", "completions"]
"""The OpenAI endpoints an engine answers (`/v1/chat/completions`, `/v1/completions`)."""
JSON = "application/json"
SSE = "text/event-stream"


@dataclass(frozen=True, slots=True)
class OpenAIRequest:
    """One OpenAI request as the replica receives it: the client's body unchanged (the backend validates it
    against what it implements), and what the ingress and the router know of it."""

    kind: EngineKind
    body: dict[str, Any]
    rid: str
    """The request id: the response's `id`, and the engine's id for it (abort, published pending requests)."""
    session_id: str | None = None
    prompt_tokens: int = 0
    """The prompt's size as routing counted it (the backend counts its own for usage)."""
    traffic_class: TrafficClass = TrafficClass.SHORT
    """The router's class for this request (set by the replica from the route decision)."""
    cached_tokens: int = 0
    """Prompt tokens the router counted as held by this replica's engine (set from the route decision)."""
    prompt_ids: Sequence[int] | None = None
    """The prompt's token ids as the ingress made them for routing (the engine's tokenizer and template), so the
    engine need not tokenize again; None where the backend tokenizes itself."""
    tenant: str = DEFAULT_TENANT
    """Whom the request is billed to (`serve_app.tenants`): the engine shares its passes among tenants."""
    tenant_weight: float | None = None
    """The tenant's weight from the key table; None: the engine policy's own weight for the tenant, else 1."""

    @property
    def uncached_tokens(self) -> int:
        return max(1, self.prompt_tokens - self.cached_tokens)

    def routed_as(self, traffic_class: TrafficClass, uncached_tokens: int) -> OpenAIRequest:
        cached = max(0, self.prompt_tokens - uncached_tokens)
        return dataclasses.replace(self, traffic_class=traffic_class, cached_tokens=cached)


@dataclass(frozen=True, slots=True)
class ResponseStart:
    """First item of a response the engine wrote: the status and the media type (`application/json`, or
    `text/event-stream` for a stream). `ResponseBody` items follow."""

    status: int
    media_type: str


@dataclass(frozen=True, slots=True)
class ResponseBody:
    """Bytes of the response, passed to the client as they are (SSE events or a JSON body)."""

    data: bytes
    error_status: int | None = None
    """Set when these bytes end a started stream with an error event: the status the request ended with."""


@dataclass(frozen=True, slots=True)
class EngineError:
    """The replica refused the request before its engine saw it (backpressure): an HTTP status and a message."""

    status: int
    message: str
    code: str | None = None
    """OpenAI's error code, e.g. `rate_limit_exceeded` (None: the status says enough)."""
    retry_after_s: int | None = None
    """Sent as `Retry-After`."""


ResponsePart = ResponseStart | ResponseBody
"""What a backend writes."""

ResponseItem = ResponseStart | ResponseBody | EngineError
"""What the engine replica streams to the ingress: a backend's parts, or the replica's own refusal."""


def shows_output(part: ResponseItem, text_field: str) -> bool:
    """A body the client must see now: generated output (text, reasoning or a tool call: `output_events`), or the
    error that ends the stream. A chat's opening event (its role, no text) is none: the first token comes after it,
    sometimes an engine step later."""
    if not isinstance(part, ResponseBody):
        return False
    return part.error_status is not None or output_events(part.data, text_field) > 0


def carries_output(items: Sequence[ResponseItem], text_field: str) -> bool:
    """Whether any of `items` is a body the client must see now (`shows_output`)."""
    return any(shows_output(item, text_field) for item in items)


def error_response(error: OpenAIError) -> list[ResponsePart]:
    """`error` as a whole response: its status and OpenAI's error body, the bytes the ingress writes for its own."""
    return [ResponseStart(error.status, JSON), ResponseBody(error.encoded())]


def joined_bodies(items: Sequence[ResponsePart]) -> list[ResponsePart]:
    """`items` with each run of consecutive `ResponseBody`s joined into one (the same bytes, fewer stream items;
    the run's error status, if any, kept)."""
    out: list[ResponsePart] = []
    run: list[ResponseBody] = []
    for item in items:
        if isinstance(item, ResponseBody):
            run.append(item)
            continue
        if run:
            out.append(_join(run))
            run = []
        out.append(item)
    if run:
        out.append(_join(run))
    return out


def _join(run: list[ResponseBody]) -> ResponseBody:
    if len(run) == 1:
        return run[0]
    error_status = next((b.error_status for b in reversed(run) if b.error_status is not None), None)
    return ResponseBody(b"".join(b.data for b in run), error_status)


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
    wait_pass_s: float = 0.0
    """Most seconds that pass lasts where the engine bounds its passes in time (the SLO sizer); 0: only
    `pass_tokens` bounds it."""
    interactive_pass_tokens: int = 0
    """The smaller pass the engine runs while short requests are pending or decoding (0: it has none)."""
    short_first: bool = False
    """A short request rides the engine's next pass, ahead of queued prefill (the policy's fair share); without
    it (upstream sglang) every prefill token queued before it goes first."""

    @property
    def num_pending(self) -> int:
        """Requests that have not produced their first token."""
        return self.num_waiting + self.num_prefilling

    def without_requests(self) -> ReplicaLoad:
        """This load with no request in it: the engine's capacity and rates, its cache, nothing queued or running."""
        return replace(self, num_waiting=0, num_prefilling=0, num_decoding=0, prefill_tokens=0)

    def to_dict(self) -> dict[str, int | float | bool]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> ReplicaLoad:
        d = d or {}
        defaults = cls()
        # Each field parsed as its default's type; a field a replica did not publish keeps the default.
        return cls(**{f: type(getattr(defaults, f))(d.get(f, getattr(defaults, f))) for f in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class EngineCapacity:
    """What sizes a replica's backpressure limits (`backpressure.derive_limits`), as its engine knows it."""

    context_limit_tokens: int
    """The largest request (prompt and output) the engine takes."""
    prefill_tokens_per_s: float | None = None
    """The engine's prefill rate in its own time, when it has one: the queued-token limit is a minute of it."""
    wall_prefill_tokens_per_s: float | None = None
    """The same rate in wall-clock seconds, which `Retry-After` counts in (None: a fixed `Retry-After`)."""


@dataclass
class EngineCounters:
    """Monotonic counts a backend keeps for metrics and the admin view."""

    num_finished: int = 0
    num_aborted: int = 0
    num_skip_ahead: int = 0
    """Requests admitted ahead of an earlier request rejected for KV capacity."""
    sized_passes: int = 0
    """Passes the policy sized (`scheduler.slo_sizing.SloCounters.sized_passes`; 0 with the policy off)."""
    passes_over_target: dict[str, int] = field(default_factory=dict)
    """By target (`ttft`, `tbt`): sized passes in which even the smallest pass the policy can plan breaks it
    (`SloCounters.missed_passes`): the hardware cannot meet that target there."""


class EngineBackend(Protocol):
    """Every call the engine replica makes on its backend."""

    async def start(self) -> None:
        """Bring the engine up (called once, inside the replica's event loop)."""

    def respond(self, request: OpenAIRequest) -> AsyncGenerator[list[ResponsePart], None]:
        """The OpenAI response to `request`, as lists of what is ready together: a `ResponseStart` first, then
        `ResponseBody` bytes. Bad input and refusals are error responses, never exceptions; an exception is a bug
        (the client gets a 500). Closing the iteration early aborts the request in the engine."""
        ...

    def load(self) -> ReplicaLoad: ...

    def capacity(self) -> EngineCapacity:
        """The figures backpressure is sized from, under the knobs in force."""
        ...

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

    def held_prefixes(self, limit: int) -> list[int]:
        """Up to `limit` prefix pages the engine's prefix cache holds (`replica.held_prefixes`, from the engine's own
        KV events), the most recently stored: published to routers."""
        ...

    def pending_requests(self, limit: int) -> dict[str, int]:
        """Up to `limit` requests without a first token yet: id -> uncached prompt tokens still to prefill."""
        ...

    def counters(self) -> EngineCounters: ...

    def describe(self) -> dict[str, Any]:
        """Admin view: active policy, active request ids, KV."""
        ...

    async def shutdown(self) -> None: ...
