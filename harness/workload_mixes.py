"""Mixes of requests for comparing the simulator with real sglang (`sim_vs_sglang`): hand-written ones, and a
seeded generator of random ones.

A mix runs on an idle engine. Its requests arrive in batches: batch 0 when the mix starts, each later batch a few
forward passes into the mix (`Mix.after_passes`). The random mixes are drawn for one small engine (`EngineLimits`:
sglang on CPU with a 256-token chunk, three running slots and a 4,096-token KV pool): documents (some longer than
the policy's short-request bound), medium requests and questions of varied output lengths, sized so that the
running slots and the KV pool are contended in many of them.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class MixRequest:
    rid: str
    prompt_tokens: int
    output_tokens: int
    batch: int = 0
    """The batch it arrives in: 0 when the mix starts, later ones `Mix.after_passes` into it."""


@dataclass(frozen=True)
class Mix:
    name: str
    requests: tuple[MixRequest, ...]
    """In arrival order (a batch's requests are queued in this order)."""
    after_passes: tuple[int, ...] = (0,)
    """For each batch, the forward passes into the mix at which it is sent (batch 0: 0)."""

    def __post_init__(self) -> None:
        batches = sorted({r.batch for r in self.requests})
        if batches != list(range(len(self.after_passes))):
            raise ValueError(f"{self.name}: batches {batches} do not match after_passes {self.after_passes}")
        if list(self.after_passes) != sorted(self.after_passes) or self.after_passes[0] != 0:
            raise ValueError(f"{self.name}: after_passes {self.after_passes} must start at 0 and not decrease")

    def batch(self, index: int) -> list[MixRequest]:
        return [r for r in self.requests if r.batch == index]


def one_batch(name: str, *requests: tuple[str, int, int]) -> Mix:
    """A mix whose (rid, prompt tokens, output tokens) requests are all queued when it starts."""
    return Mix(name, tuple(MixRequest(rid, prompt, output) for rid, prompt, output in requests))


HAND_WRITTEN = (
    one_batch("documents-and-questions", ("dq-doc", 1500, 4), ("dq-q1", 25, 6), ("dq-q2", 40, 3)),
    one_batch("kv-pressure", ("kv-doc1", 2500, 4), ("kv-doc2", 2000, 4), ("kv-q", 30, 5)),
    one_batch(
        "slot-pressure", ("sp-q1", 30, 8), ("sp-doc", 800, 4), ("sp-q2", 45, 6), ("sp-q3", 20, 5), ("sp-q4", 60, 3)
    ),
)
"""Three chosen mixes: a document with two questions; two documents that do not fit the KV pool together, and a
question; five questions and a document for three running slots."""

SLOT_TURNOVER = one_batch(
    "slot-turnover",
    ("st-doc1", 2000, 4),
    ("st-q1", 30, 5),
    ("st-q2", 25, 3),
    ("st-doc2", 1700, 4),
    ("st-q3", 40, 6),
    ("st-med", 300, 8),
    ("st-q4", 20, 4),
    ("st-q5", 35, 3),
)
"""Two documents that together nearly fill the KV pool, questions that decode a handful of tokens each and one
medium request: the questions finish one after another while a document prefills, so a slot frees in the middle of
the document's chunks, one pass later under sglang's overlap scheduler than without it."""


@dataclass(frozen=True)
class EngineLimits:
    kv_pool_tokens: int = 4096
    max_running_requests: int = 3
    chunk_tokens: int = 256


@dataclass(frozen=True)
class RequestKind:
    prefix: str
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]


DOCUMENT = RequestKind("d", (700, 3000), (1, 6))
MEDIUM = RequestKind("m", (150, 700), (2, 12))
QUESTION = RequestKind("q", (8, 160), (1, 16))


def random_mix(seed: int, limits: EngineLimits = EngineLimits()) -> Mix:
    """A random mix, the same for the same seed: 0-3 documents whose KV needs together take 50-130% of the pool,
    0-2 medium requests and 1-6 questions, in random order, arriving in one batch or in two or three batches
    2-10 forward passes apart."""
    rng = random.Random(seed)
    name = f"random-{seed}"
    requests: list[tuple[str, int, int]] = []
    num_docs = rng.choice((0, 1, 1, 2, 2, 2, 3))
    doc_kv = rng.uniform(0.5, 1.3) * limits.kv_pool_tokens
    for i in range(num_docs):
        output = rng.randint(*DOCUMENT.output_tokens)
        share = doc_kv / num_docs * rng.uniform(0.7, 1.3)
        prompt = int(min(max(share - output, DOCUMENT.prompt_tokens[0]), DOCUMENT.prompt_tokens[1]))
        prompt = min(prompt, limits.kv_pool_tokens - output - 8)  # every request fits the pool alone
        requests.append((f"{name}-d{i}", prompt, output))
    for kind, count in ((MEDIUM, rng.choice((0, 0, 1, 1, 2))), (QUESTION, rng.randint(1, 6))):
        for i in range(count):
            requests.append(
                (f"{name}-{kind.prefix}{i}", rng.randint(*kind.prompt_tokens), rng.randint(*kind.output_tokens))
            )
    rng.shuffle(requests)
    num_batches = 1 if rng.random() < 0.5 or len(requests) < 3 else rng.choice((2, 3))
    after_passes = [0]
    for _ in range(num_batches - 1):
        after_passes.append(after_passes[-1] + rng.randint(2, 10))
    # Batch 0 gets at least one request, each later batch at least one, the rest at random (arrival order kept).
    cuts = sorted(rng.sample(range(1, len(requests)), num_batches - 1))
    bounds = [0, *cuts, len(requests)]
    mix_requests = tuple(
        MixRequest(rid, prompt, output, batch)
        for batch, (start, end) in enumerate(itertools.pairwise(bounds))
        for rid, prompt, output in requests[start:end]
    )
    return Mix(name, mix_requests, tuple(after_passes))
