"""A streamed OpenAI response as the client sees it: SSE events with arrival times, then its timings.

Locust's own timing of a streamed request stops when the response headers arrive; the first token,
the gaps between tokens and the end of the stream are measured here, from the bytes as they arrive.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

DONE = "[DONE]"


@dataclass
class SseEvent:
    t_s: float
    """Arrival time of the network chunk that completed the event."""
    data: str
    event: str = "message"

    def json(self) -> dict[str, Any] | None:
        try:
            payload = json.loads(self.data)
        except ValueError:
            return None
        return payload if isinstance(payload, dict) else None


class SseParser:
    """Incremental SSE parser (the `text/event-stream` format): feed bytes as they arrive."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []
        self._event = "message"
        self.events: list[SseEvent] = []

    def feed(self, chunk: bytes, t_s: float) -> None:
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for raw in lines:
            self._line(raw.rstrip(b"\r").decode("utf-8", errors="replace"), t_s)

    def close(self, t_s: float) -> None:
        """End of the body: a last line without a newline still counts (an event needs its blank line)."""
        if self._buf:
            self._line(self._buf.rstrip(b"\r").decode("utf-8", errors="replace"), t_s)
            self._buf = b""

    def _line(self, line: str, t_s: float) -> None:
        if not line:
            if self._data:
                self.events.append(SseEvent(t_s, "\n".join(self._data), self._event))
            self._data, self._event = [], "message"
            return
        if line.startswith(":"):
            return  # a comment (keep-alive)
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value


@dataclass
class StreamOutcome:
    """What one streamed completion gave: timings in seconds from the send, and whether it is whole."""

    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    """One gap per output token after the first (a chunk carrying k tokens after a gap g gives k gaps of g/k)."""
    e2e_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None
    """Why the stream is a failure (no `[DONE]`, an error event); None when it is whole."""


def content_of(payload: dict[str, Any]) -> str:
    """Text of a chat (`delta.content`) or completions (`text`) chunk."""
    choices = payload.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return delta.get("content") or ""
    return choice.get("text") or ""


def outcome(events: list[SseEvent], sent_s: float) -> StreamOutcome:
    """Timings of a stream of events; `error` is set when it has an error event or never reached `[DONE]`."""
    out = StreamOutcome()
    content_times: list[float] = []
    completion_tokens: int | None = None
    for ev in events:
        if ev.data.strip() == DONE:
            out.e2e_s = ev.t_s - sent_s
            break
        payload = ev.json()
        if ev.event == "error" or payload is None or "error" in payload:
            out.error = f"error event in stream: {ev.data[:200]}"
            return out
        if content_of(payload):
            content_times.append(ev.t_s)
        usage = payload.get("usage")
        if isinstance(usage, dict):
            completion_tokens = usage.get("completion_tokens")
            out.prompt_tokens = usage.get("prompt_tokens")
            out.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if out.e2e_s is None:
        out.error = "stream ended without [DONE]"
    if content_times:
        out.ttft_s = content_times[0] - sent_s
    out.output_tokens = completion_tokens if completion_tokens is not None else len(content_times)
    out.itl_s = token_gaps(content_times, out.output_tokens)
    return out


def token_gaps(content_times: list[float], output_tokens: int) -> list[float]:
    """Per-token gaps after the first token. OpenAI chunks do not say how many tokens each carries: when the
    usage count differs from the number of chunks, the tokens after the first are spread as evenly as whole
    tokens allow over them (the first chunks take one more), so there is one gap a token."""
    gaps = [b - a for a, b in itertools.pairwise(content_times)]
    later_tokens = output_tokens - 1
    if not gaps or later_tokens <= len(gaps):
        return gaps
    each, extra = divmod(later_tokens, len(gaps))
    out: list[float] = []
    for i, g in enumerate(gaps):
        k = each + (1 if i < extra else 0)
        out += [g / k] * k
    return out
