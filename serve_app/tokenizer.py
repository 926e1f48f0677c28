"""Prompt rendering and tokenization as the engine does them: at the ingress (routing needs the prompt's size and
its prefix pages before a replica is chosen), and in the sim backend (its engine's prompt, cache and `usage`).

`sim`: a deterministic approximate tokenizer (a token is `chars_per_token` characters), no downloads.
`sglang`: the model's own tokenizer and chat template, loaded from the local model path, used as sglang's serving
classes use them (so the ingress's token ids, and the prefix pages hashed from them, are the engine's).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from serve_app.config import AppConfig
from serve_app.routing.prefix_pages import TokenIds


class PromptTokenizer(Protocol):
    blocking: bool
    """Rendering and tokenizing take long enough on a long prompt to be moved off the event loop."""

    def render_chat(self, messages: list[dict[str, str]]) -> str: ...

    def count(self, text: str) -> int: ...

    def chat_ids(self, messages: list[dict[str, str]]) -> TokenIds:
        """A chat's prompt token ids: rendered with the chat template (the generation prompt added), as the engine's
        chat endpoint tokenizes it."""
        ...

    def text_ids(self, text: str) -> TokenIds:
        """A completions prompt's token ids, as the engine's completions endpoint tokenizes it."""
        ...


_MIX = np.array([0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1, 0xD3A2646C, 0xFD7046C5, 0xB55A4F09])
"""Odd multipliers, one per character position in a token: a token's id mixes its characters and their order."""


class ApproxTokenizer:
    blocking = False  # arithmetic on the text, vectorized

    def __init__(self, chars_per_token: float = 4.0) -> None:
        self.chars_per_token = chars_per_token

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        # A plain transcript, so a session's next prompt extends its previous one (prefix caching).
        return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"

    def count(self, text: str) -> int:
        return max(1, math.ceil(len(text) / self.chars_per_token))

    def chat_ids(self, messages: list[dict[str, str]]) -> TokenIds:
        return self.text_ids(self.render_chat(messages))

    def text_ids(self, text: str, first: int = 0) -> TokenIds:
        """`count(text)` ids: token `i` is the characters from `floor(i * chars_per_token)`, hashed. From token
        `first` on: only its characters and the ones after are read."""
        n = self.count(text)
        if not text:
            return np.zeros(1, dtype=np.int64)[first:]
        starts = np.minimum(np.floor(np.arange(first, n) * self.chars_per_token).astype(np.int64), len(text) - 1)
        if len(starts) == 0:
            return np.zeros(0, dtype=np.int64)
        offset = int(starts[0])
        codes = np.frombuffer(text[offset:].encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
        starts -= offset
        token_of = np.searchsorted(starts, np.arange(len(codes)), side="right") - 1
        position = (np.arange(len(codes)) - starts[token_of]) % len(_MIX)
        mixed = codes * _MIX[position].astype(np.uint64)
        return (np.add.reduceat(mixed, starts) & np.uint64(0x7FFFFFFF)).astype(np.int64)

    def extended_ids(self, text: str, ids: TokenIds, more: str) -> TokenIds:
        """The ids of `text + more`, given `text`'s: all but its last token are whole in `text`, so they stand;
        only the rest is read (a document's answer is cached without reading the document again)."""
        keep = max(0, len(ids) - 1)
        return np.concatenate([np.asarray(ids, dtype=np.int64)[:keep], self.text_ids(text + more, first=keep)])


class HFTokenizer:
    """The model's tokenizer (transformers comes with sglang). Loaded lazily: only the sglang backend uses it.

    A chat is encoded by the text between the special tokens its template puts in, each such text remembered
    (sglang's own `encode_prompt_segments` and its bounded segment cache, which cuts only where the tokenizer's
    configuration makes the ids the same as one encode of the whole, and encodes the whole otherwise): a
    conversation sent again with one more turn, a follow-up question on a document, is tokenized only where it is
    new."""

    blocking = True  # ~1 s to count an 800k-character prompt on one core

    def __init__(self, model_path: str) -> None:
        from sglang.srt.entrypoints.openai.parallel_prompt_encode import encode_prompt_segments
        from transformers import AutoTokenizer  # comes with sglang; GPU deployments only

        self._tok = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
        self._encode_segments: Callable[[Any, list[str], dict[str, bool]], Sequence[int]] = encode_prompt_segments
        added = sorted({t.content for t in self._tok.added_tokens_decoder.values() if t.content}, key=len, reverse=True)
        # Longest first, as the tokenizer matches them; a capture group keeps each token as a segment of its own.
        self._specials = re.compile("(" + "|".join(map(re.escape, added)) + ")") if added else None

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        rendered = self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert isinstance(rendered, str)  # `tokenize=False`: the text
        return rendered

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False))

    def chat_ids(self, messages: list[dict[str, str]]) -> TokenIds:
        # sglang renders the template to text and encodes it without adding special tokens (the template has them).
        text = self.render_chat(messages)
        segments = [s for s in self._specials.split(text) if s] if self._specials else [text]
        return list(self._encode_segments(self._tok, segments, {"add_special_tokens": False}))

    def text_ids(self, text: str) -> TokenIds:
        # sglang encodes a completions prompt with the tokenizer's defaults (a BOS where the model has one).
        return list(self._tok.encode(text))


def make_tokenizer(cfg: AppConfig) -> PromptTokenizer:
    if cfg.backend == "sim":
        return ApproxTokenizer(cfg.sim.chars_per_token)
    return HFTokenizer(cfg.sglang.model_path)
