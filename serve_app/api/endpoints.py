"""The two OpenAI endpoints an engine answers, as the ingress sees them: their names, the id prefix of their
responses, the field of a streamed chunk that carries text (the stream metrics count it), and what routing reads of
a request (`routing_prompt`). How the sim backend writes their responses is `engines.sim.formats`.
"""

from __future__ import annotations

from typing import Any, Protocol

from serve_app.replica.backend import EngineKind
from serve_app.tokenizer import PromptTokenizer


class Endpoint(Protocol):
    name: EngineKind
    """The engine's name for it, and the metrics tag (`fairshare_requests_total{endpoint=...}`)."""
    id_prefix: str
    prompt_param: str
    """The request field that holds the prompt (named by a too-long-prompt error)."""
    text_field: str
    """The field of a streamed chunk's choice that carries the generated text (`sse.token_events`)."""

    def routing_prompt(self, raw: dict[str, Any], tokenizer: PromptTokenizer) -> str:
        """The prompt's text as routing counts it, from a request the engine itself will validate."""
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

    def routing_prompt(self, raw: dict[str, Any], tokenizer: PromptTokenizer) -> str:
        messages = raw.get("messages")
        if not isinstance(messages, list):
            return ""
        rendered = [{"role": "user", "content": _text(m.get("content"))} for m in messages if isinstance(m, dict)]
        return tokenizer.render_chat(rendered) if rendered else ""


class CompletionsEndpoint:
    name: EngineKind = "completions"
    id_prefix = "cmpl"
    prompt_param = "prompt"
    text_field = "text"

    def routing_prompt(self, raw: dict[str, Any], tokenizer: PromptTokenizer) -> str:
        return _text(raw.get("prompt"))


CHAT = ChatEndpoint()
COMPLETIONS = CompletionsEndpoint()
