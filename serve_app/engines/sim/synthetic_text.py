"""The words a simulated stream carries: deterministic, so tests can aim `stop` at them."""

from __future__ import annotations

SYNTHETIC_WORDS = (
    "the",
    "quick",
    "answer",
    "is",
    "that",
    "shorter",
    "passes",
    "keep",
    "chats",
    "responsive",
    "while",
    "long",
    "documents",
    "still",
    "prefill",
    "at",
    "nearly",
    "full",
    "speed",
    "because",
    "every",
    "request",
    "gets",
    "a",
    "fair",
    "share",
    "of",
    "each",
    "forward",
    "pass",
)


def synthetic_text(start: int, end: int) -> str:
    """Output tokens [start, end) as words, one word and a space per token."""
    return "".join(SYNTHETIC_WORDS[i % len(SYNTHETIC_WORDS)] + " " for i in range(start, end))
