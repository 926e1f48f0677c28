"""Server-sent events of OpenAI's streams: writing one (`sse`, `EventTemplate` for the many deltas of a stream),
counting the ones that carry generated output in relayed bytes (`output_events`) and reading the `usage` they carry
(`usage_in`, which reads a whole JSON response's too)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_json


def sse(data: BaseModel | dict[str, Any] | str, *, exclude: set[str] | None = None) -> str:
    """One server-sent event. Pydantic models are written with `exclude` left out (e.g. `usage` when the
    client did not ask for it in chunks)."""
    if isinstance(data, BaseModel):
        payload = data.model_dump_json(exclude=exclude)
    elif isinstance(data, dict):
        payload = json.dumps(data, separators=(",", ":"))
    else:
        payload = data
    return f"data: {payload}\n\n"


class EventTemplate:
    """The SSE event of `model` with one string field open, for the many events of a stream that differ only
    in it (the deltas): the model is serialized once, each event then costs one string's encoding, the same
    bytes as `sse(model with that string)`. Building and dumping a chunk model per delta cost ~40 µs each.

    Make the model with `EventTemplate.SLOT` where the string goes: `EventTemplate(endpoint.delta(ids, SLOT))`."""

    SLOT = "\x00fairshare-event-slot\x00"

    def __init__(self, model: BaseModel, *, exclude: set[str] | None = None) -> None:
        slot = to_json(self.SLOT).decode()
        head, found, tail = sse(model, exclude=exclude).partition(slot)
        if not found or slot in tail:
            raise ValueError("the model must carry EventTemplate.SLOT exactly once")
        self._head, self._tail = head, tail

    def __call__(self, text: str) -> str:
        return self._head + to_json(text).decode() + self._tail


TEXT_FIELDS = {"chat": "content", "completions": "text"}
"""The field of each endpoint's streamed chunk (its choice's delta, or its choice) that carries generated text."""
_OUTPUT_EVENT = {
    "content": re.compile(rb'"(?:content|reasoning_content)": ?"(?!")|"tool_calls": ?\['),
    "text": re.compile(rb'"text": ?"(?!")'),
}
"""Per text field, what marks an event that carries generated output: a non-empty string in the field, and in a chat
chunk's delta also a non-empty `reasoning_content` (a reasoning model's thinking) or a `tool_calls` list (a tool
call's name or a fragment of its arguments: sglang streams a call so, with no text)."""


def output_events(data: bytes, text_field: str) -> int:
    """How many SSE events in `data` carry generated output (`_OUTPUT_EVENT`): text in `text_field` (`content` in
    chat chunks, `text` in completion chunks), or a chat delta's reasoning text or tool call. A byte scan, no JSON
    decoding: the opening role chunk (`"content":""`), the finish, usage and error events and `[DONE]` carry none,
    and a quote inside text is escaped, so text that quotes a field is no match. One event may carry several tokens
    (engines coalesce under load); the ingress cannot see how many without the tokenizer."""
    return len(_OUTPUT_EVENT[text_field].findall(data))


_USAGE = re.compile(rb'"usage": ?\{')


def usage_in(data: bytes) -> tuple[int, int] | None:
    """Prompt and completion tokens of the last `usage` object in relayed bytes (a JSON response, or SSE events),
    None without one. A byte scan first: most stream items carry none (`"usage":null` is no object), and text
    that quotes one is escaped, so only the events that carry one are decoded."""
    if _USAGE.search(data) is None:
        return None
    found = None
    for payload in _usage_payloads(data):
        try:
            event = json.loads(payload)
        except ValueError:
            continue
        usage = event.get("usage") if isinstance(event, dict) else None
        if isinstance(usage, dict):
            found = (_tokens(usage, "prompt_tokens"), _tokens(usage, "completion_tokens"))
    return found


def _usage_payloads(data: bytes) -> Iterator[bytes]:
    if not data.lstrip().startswith(b"data:"):
        yield data  # a whole JSON response
        return
    for line in data.split(b"\n"):
        if line.startswith(b"data:") and _USAGE.search(line) is not None:
            yield line[5:]


def _tokens(usage: dict[str, Any], field: str) -> int:
    n = usage.get(field)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0
