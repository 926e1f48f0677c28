"""The two OpenAI endpoints an engine answers, as formats: what the ingress reads of a request to route it
(`routing_prompt`, the text field its stream metrics count), and how the sim backend renders a prompt and
writes the responses (`sim.serving`). Everything else is the same code for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from serve_app.protocol.openai_models import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    Completion,
    CompletionChoice,
    CompletionRequest,
    FinishReason,
    SamplingRequest,
    Usage,
)
from serve_app.replica.backend import EngineKind
from serve_app.tokenizer import PromptTokenizer


@dataclass(frozen=True, slots=True)
class ResponseIds:
    """What every response object of one request carries."""

    id: str
    created: int
    model: str


class Endpoint(Protocol):
    name: EngineKind
    """The engine's name for it, and the metrics tag (`fairshare_requests_total{endpoint=...}`)."""
    id_prefix: str
    prompt_param: str
    """The request field named by a too-long-prompt error."""
    text_field: str
    """The field of a streamed chunk's choice that carries the generated text (`sse.token_events`)."""

    @property
    def request_model(self) -> type[SamplingRequest]:
        """The sim backend's request model: the fields it supports (a 400 names any other)."""
        ...

    def prompt(self, body: Any, tokenizer: PromptTokenizer) -> str:
        """The prompt of a request validated as `request_model`."""
        ...

    def routing_prompt(self, raw: dict[str, Any], tokenizer: PromptTokenizer) -> str:
        """The prompt's text as routing counts it, from a request the engine itself will validate (sglang)."""
        ...

    def response(self, ids: ResponseIds, text: str, finish: FinishReason | None, usage: Usage) -> BaseModel: ...

    def opening(self, ids: ResponseIds) -> list[BaseModel]:
        """Events sent before the first token."""
        ...

    def delta(self, ids: ResponseIds, text: str) -> BaseModel: ...

    def finish(self, ids: ResponseIds, finish: FinishReason) -> BaseModel: ...

    def usage(self, ids: ResponseIds, usage: Usage) -> BaseModel:
        """The closing usage event (`stream_options.include_usage`): no choices."""
        ...


def _text(content: Any) -> str:
    """Text of a message's content or a prompt, whatever its shape (parts, lists); the rest is not text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text(c.get("text") if isinstance(c, dict) else c) for c in content)
    return ""


class ChatEndpoint:
    name: EngineKind = "chat"
    id_prefix = "chatcmpl"
    prompt_param = "messages"
    text_field = "content"
    request_model = ChatCompletionRequest

    def routing_prompt(self, raw: dict[str, Any], tokenizer: PromptTokenizer) -> str:
        messages = raw.get("messages")
        if not isinstance(messages, list):
            return ""
        rendered = [{"role": "user", "content": _text(m.get("content"))} for m in messages if isinstance(m, dict)]
        return tokenizer.render_chat(rendered) if rendered else ""

    def prompt(self, body: ChatCompletionRequest, tokenizer: PromptTokenizer) -> str:
        return tokenizer.render_chat([{"role": m.role, "content": m.text} for m in body.messages])

    def response(self, ids: ResponseIds, text: str, finish: FinishReason | None, usage: Usage) -> ChatCompletion:
        choice = ChatChoice(message=AssistantMessage(content=text), finish_reason=finish)
        return ChatCompletion(id=ids.id, created=ids.created, model=ids.model, choices=[choice], usage=usage)

    def _chunk(
        self, ids: ResponseIds, choices: list[ChatChunkChoice], usage: Usage | None = None
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=ids.id, created=ids.created, model=ids.model, choices=choices, usage=usage)

    def opening(self, ids: ResponseIds) -> list[BaseModel]:
        return [self._chunk(ids, [ChatChunkChoice(delta=ChatDelta(role="assistant", content=""))])]

    def delta(self, ids: ResponseIds, text: str) -> ChatCompletionChunk:
        return self._chunk(ids, [ChatChunkChoice(delta=ChatDelta(content=text))])

    def finish(self, ids: ResponseIds, finish: FinishReason) -> ChatCompletionChunk:
        return self._chunk(ids, [ChatChunkChoice(delta=ChatDelta(), finish_reason=finish)])

    def usage(self, ids: ResponseIds, usage: Usage) -> ChatCompletionChunk:
        return self._chunk(ids, [], usage)


class CompletionsEndpoint:
    name: EngineKind = "completions"
    id_prefix = "cmpl"
    prompt_param = "prompt"
    text_field = "text"
    request_model = CompletionRequest

    def routing_prompt(self, raw: dict[str, Any], tokenizer: PromptTokenizer) -> str:
        return _text(raw.get("prompt"))

    def prompt(self, body: CompletionRequest, tokenizer: PromptTokenizer) -> str:
        return body.prompt_text

    def _completion(self, ids: ResponseIds, choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
        return Completion(id=ids.id, created=ids.created, model=ids.model, choices=choices, usage=usage)

    def response(self, ids: ResponseIds, text: str, finish: FinishReason | None, usage: Usage) -> Completion:
        return self._completion(ids, [CompletionChoice(text=text, finish_reason=finish)], usage)

    def opening(self, ids: ResponseIds) -> list[BaseModel]:
        return []

    def delta(self, ids: ResponseIds, text: str) -> Completion:
        return self._completion(ids, [CompletionChoice(text=text)])

    def finish(self, ids: ResponseIds, finish: FinishReason) -> Completion:
        return self._completion(ids, [CompletionChoice(text="", finish_reason=finish)])

    def usage(self, ids: ResponseIds, usage: Usage) -> Completion:
        return self._completion(ids, [], usage)


CHAT = ChatEndpoint()
COMPLETIONS = CompletionsEndpoint()
