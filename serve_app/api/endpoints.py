"""The two OpenAI endpoints an engine answers, as the ingress sees them: their names, the id prefix of their
responses, the field of a streamed chunk that carries text (the stream metrics count it), and what routing reads of
a request (`prompt_ids`). How the sim backend writes their responses is `engines.sim.formats`.
"""

from __future__ import annotations

from typing import Any, Protocol

from serve_app.protocol.sse import TEXT_FIELDS
from serve_app.replica.backend import EngineKind
from serve_app.routing.prefix_pages import TokenIds
from serve_app.tokenizer import PromptTokenizer


class Endpoint(Protocol):
    name: EngineKind
    """The engine's name for it, and the metrics tag (`fairshare_requests_total{endpoint=...}`)."""
    id_prefix: str
    prompt_param: str
    """The request field that holds the prompt (named by a too-long-prompt error)."""
    text_field: str
    """The field of a streamed chunk's choice that carries the generated text (`sse.output_events`)."""

    def prompt_ids(self, raw: dict[str, Any], tokenizer: PromptTokenizer) -> TokenIds:
        """The prompt's token ids as the engine will make them (routing counts and hashes them), from a request the
        engine itself will validate (what it will refuse is tokenized as best it can be)."""
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
    text_field = TEXT_FIELDS["chat"]

    def prompt_ids(self, raw: dict[str, Any], tokenizer: PromptTokenizer) -> TokenIds:
        messages = raw.get("messages")
        if not isinstance(messages, list):
            return ()
        rendered = [
            {"role": str(m.get("role")), "content": _text(m.get("content"))} for m in messages if isinstance(m, dict)
        ]
        if not rendered:
            return ()
        try:
            return tokenizer.chat_ids(rendered)
        except Exception:  # a template that refuses these messages: the engine will say why (400)
            return tokenizer.chat_ids([{"role": "user", "content": m["content"]} for m in rendered])


class CompletionsEndpoint:
    name: EngineKind = "completions"
    id_prefix = "cmpl"
    prompt_param = "prompt"
    text_field = TEXT_FIELDS["completions"]

    def prompt_ids(self, raw: dict[str, Any], tokenizer: PromptTokenizer) -> TokenIds:
        text = _text(raw.get("prompt"))
        return tokenizer.text_ids(text) if text else ()


CHAT = ChatEndpoint()
COMPLETIONS = CompletionsEndpoint()
