"""How the sim backend writes the two OpenAI endpoints' responses: the request fields it supports, the prompt it
renders, and the response objects (whole, and a stream's events). sglang's backend has sglang's serving classes for
this; what the ingress reads of each endpoint is `api.endpoints`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from serve_app.api.endpoints import CHAT, COMPLETIONS, ChatEndpoint, CompletionsEndpoint, Endpoint
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


class ResponseFormat(Protocol):
    @property
    def endpoint(self) -> Endpoint:
        """The endpoint it writes for."""
        ...

    @property
    def request_model(self) -> type[SamplingRequest]:
        """The fields the sim backend supports (a 400 names any other)."""
        ...

    def prompt(self, body: Any, tokenizer: PromptTokenizer) -> str:
        """The prompt of a request validated as `request_model`."""
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


class ChatFormat:
    endpoint: ChatEndpoint = CHAT
    request_model = ChatCompletionRequest

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


class CompletionsFormat:
    endpoint: CompletionsEndpoint = COMPLETIONS
    request_model = CompletionRequest

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


FORMATS: dict[EngineKind, ResponseFormat] = {"chat": ChatFormat(), "completions": CompletionsFormat()}
