"""Prompt rendering and token counting: at the ingress (routing needs the count before a replica is chosen),
and in the sim backend (its engine's prompt size and `usage`).

`sim`: a deterministic approximate tokenizer (a token is `chars_per_token` characters), no downloads.
`sglang`: the model's own tokenizer and chat template, loaded from the local model path.
"""

from __future__ import annotations

import math
from typing import Protocol

from serve_app.config import AppConfig


class PromptTokenizer(Protocol):
    blocking: bool
    """Rendering and counting take long enough on a long prompt to be moved off the event loop."""

    def render_chat(self, messages: list[dict[str, str]]) -> str: ...

    def count(self, text: str) -> int: ...


class ApproxTokenizer:
    blocking = False  # arithmetic on the text's length

    def __init__(self, chars_per_token: float = 4.0) -> None:
        self.chars_per_token = chars_per_token

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        # A plain transcript, so a session's next prompt extends its previous one (prefix caching).
        return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"

    def count(self, text: str) -> int:
        return max(1, math.ceil(len(text) / self.chars_per_token))


class HFTokenizer:
    """The model's tokenizer (transformers comes with sglang). Loaded lazily: only the sglang backend uses it."""

    blocking = True  # ~1 s to count an 800k-character prompt on one core

    def __init__(self, model_path: str) -> None:
        from transformers import AutoTokenizer  # comes with sglang; GPU deployments only

        self._tok = AutoTokenizer.from_pretrained(model_path, local_files_only=True)

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        rendered = self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert isinstance(rendered, str)  # `tokenize=False`: the text
        return rendered

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False))


def make_tokenizer(cfg: AppConfig) -> PromptTokenizer:
    if cfg.backend == "sim":
        return ApproxTokenizer(cfg.sim.chars_per_token)
    return HFTokenizer(cfg.sglang.model_path)
