"""Server-sent events of OpenAI's streams: writing one (`sse`, `EventTemplate` for the many deltas of a stream)
and counting the ones that carry text in relayed bytes (`token_events`)."""

from __future__ import annotations

import json
import re
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


_TOKEN_EVENT = {field: re.compile(rb'"' + field.encode() + rb'": ?"(?!")') for field in ("content", "text")}


def token_events(data: bytes, text_field: str) -> int:
    """How many SSE events in `data` carry generated text: a non-empty `text_field` string (`content` in chat
    chunks, `text` in completion chunks). A byte scan, no JSON decoding: the opening role chunk (`"content":""`),
    the finish, usage and error events and `[DONE]` carry none. One event may carry several tokens (engines
    coalesce under load); the ingress cannot see how many without the tokenizer."""
    return len(_TOKEN_EVENT[text_field].findall(data))
