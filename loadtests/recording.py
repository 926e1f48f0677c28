"""Per-class custom metrics in Locust's statistics, and one JSON line per request for the benchmark.

Each whole stream fires, through `events.request.fire` with `name` = its traffic class (`short` or
`long`, from the `X-Traffic-Class` response header, else what the user meant to send):
`TTFT` (ms), `ITL` (ms, one sample per token gap), `E2E` (ms; response_length = output tokens) and
`TOKENS` (the output token count in the response-time column). Shed requests (429/503) are their
own `SHED` rows, not failures. Locust's row for the HTTP request itself times only the headers.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from loadtests.sse import StreamOutcome

METRIC_TYPES = ("TTFT", "ITL", "E2E", "TOKENS")
SHED_STATUSES = (429, 503)


@dataclass
class Sample:
    """One request as the client saw it (wall clock: `sent_at_s` is epoch seconds)."""

    user: str
    intent: str
    traffic_class: str
    status: int
    sent_at_s: float
    shed: bool = False
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    lane: str = ""
    session: str = ""
    replica: str = ""
    """The engine replica that served it (`X-Replica`; empty behind a front that does not say)."""
    route: str = ""
    """Why the router chose that replica (`X-Route`: `affinity`, `gave-way`, ...; empty behind a front that does not
    say)."""
    app_ttft_s: float | None = None
    """Its first token inside the app: from the ingress's receipt to the engine's first item (`Server-Timing`
    ``ttft``; None behind a front that does not say). The client's TTFT less this is the path outside the ingress
    (the front's proxy, the client, the machine's wait for a core)."""

    @classmethod
    def of(cls, outcome: StreamOutcome, **kw: Any) -> Sample:
        return cls(
            ttft_s=outcome.ttft_s,
            e2e_s=outcome.e2e_s,
            itl_s=outcome.itl_s,
            output_tokens=outcome.output_tokens,
            prompt_tokens=outcome.prompt_tokens,
            cached_tokens=outcome.cached_tokens,
            error=outcome.error,
            **kw,
        )

    @property
    def ok(self) -> bool:
        return not self.shed and self.error is None and self.status == 200


def response_meta(resp: Any, intent: str) -> dict[str, Any]:
    """What a response's status and headers say of its request, as `Sample` fields (the class the front served it
    in, else `intent`)."""
    headers = resp.headers
    return dict(
        intent=intent,
        traffic_class=headers.get("X-Traffic-Class") or intent,
        status=resp.status_code,
        lane=headers.get("X-Lane", ""),
        replica=headers.get("X-Replica", ""),
        route=headers.get("X-Route", ""),
        app_ttft_s=None if (ms := server_timing(headers.get("Server-Timing", "")).get("ttft")) is None else ms / 1000,
    )


def server_timing(header: str) -> dict[str, float]:
    """`Server-Timing: route;dur=1.2, ttft;dur=3.4` -> {"route": 1.2, "ttft": 3.4} (milliseconds)."""
    out: dict[str, float] = {}
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur" and name:
                out[name] = float(value)
    return out


def fire_metrics(request_event, sample: Sample) -> None:
    """The custom rows of a whole stream (nothing for shed or failed ones: their HTTP row says why)."""
    if not sample.ok:
        return
    cls = sample.traffic_class

    def fire(kind: str, value: float, length: int = 0) -> None:
        request_event.fire(
            request_type=kind, name=cls, response_time=value, response_length=length, exception=None, context={}
        )

    if sample.ttft_s is not None:
        fire("TTFT", sample.ttft_s * 1000)
    for gap in sample.itl_s:
        fire("ITL", gap * 1000)
    if sample.e2e_s is not None:
        fire("E2E", sample.e2e_s * 1000, sample.output_tokens)
    fire("TOKENS", sample.output_tokens, sample.output_tokens)


class SampleLog:
    """Appends samples as JSON lines (one writer per Locust process; gevent runs one greenlet at a time)."""

    def __init__(self, path: str) -> None:
        self._f: IO[str] | None = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115

    def write(self, sample: Sample) -> None:
        if self._f is not None:
            self._f.write(json.dumps(asdict(sample), separators=(",", ":")) + "\n")
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def read_samples(path) -> list[Sample]:
    with open(path, encoding="utf-8") as f:
        return [Sample(**json.loads(line)) for line in f if line.strip()]
