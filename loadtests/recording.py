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
