"""Prompts built in code (nothing is downloaded): documents of a given token count and short questions.

Token counts are approximate for a real tokenizer (`chars_per_token` characters a token) and exact for
the `sim` backend's tokenizer at the same `chars_per_token`. Every document starts with its own id, so
no two share a cacheable prefix.
"""

from __future__ import annotations

import random

TOPICS = ["revenue", "latency", "inventory", "staffing", "energy use", "churn", "shipping", "support tickets"]
VERBS = ["rose", "fell", "held steady", "doubled", "halved", "recovered", "slipped", "peaked"]
QUESTIONS = [
    "What changed most in section {k}?",
    "Summarise the trend in {topic} in one sentence.",
    "Which quarter had the highest {topic}?",
    "Is {topic} mentioned before section {k}?",
    "Give me one risk the document raises about {topic}.",
]


def text_of_tokens(num_tokens: int, chars_per_token: float, rng: random.Random, head: str = "") -> str:
    """`head` followed by report-like sentences, cut to `num_tokens * chars_per_token` characters."""
    num_chars = max(1, round(num_tokens * chars_per_token))
    parts = [head]
    size = len(head)
    k = 0
    while size < num_chars:
        k += 1
        s = (
            f"Section {k}: in quarter {rng.randint(1, 4)} {rng.choice(TOPICS)} {rng.choice(VERBS)} "
            f"by {rng.randint(1, 99)} percent against plan {rng.randint(100, 999)}. "
        )
        parts.append(s)
        size += len(s)
    return "".join(parts)[:num_chars]


def document(doc_id: str, num_tokens: int, chars_per_token: float, rng: random.Random) -> str:
    return text_of_tokens(num_tokens, chars_per_token, rng, head=f"Document {doc_id}.\n")


def question(num_tokens: int, chars_per_token: float, rng: random.Random) -> str:
    """A question of about `num_tokens` tokens (padded with context when the template is shorter)."""
    q = rng.choice(QUESTIONS).format(k=rng.randint(1, 500), topic=rng.choice(TOPICS))
    target = max(1, round(num_tokens * chars_per_token))
    if len(q) >= target:
        return q[:target]
    return text_of_tokens(num_tokens, chars_per_token, rng, head=q + " Context: ")


def system_prompt(num_tokens: int, chars_per_token: float, rng: random.Random) -> str:
    """A long system prompt of about `num_tokens` tokens: instructions, then reference notes."""
    head = "You are the analyst assistant of a reporting team. Answer briefly, from these notes only.\n"
    return text_of_tokens(num_tokens, chars_per_token, rng, head=head)
