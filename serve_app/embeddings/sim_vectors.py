"""The sim embeddings model: deterministic unit vectors, so tests and benchmarks need no weights.

A vector depends only on its input (its text or token ids) and the configured dimension: the same input
always gets the same vector, on every replica. `dimensions` (OpenAI's shortening) keeps the first
`dimensions` components and normalises again, as OpenAI's text-embedding-3 models do.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

EmbeddingInput = str | list[int]


def _seed(item: EmbeddingInput) -> int:
    data = item.encode() if isinstance(item, str) else ",".join(map(str, item)).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def sim_vector(item: EmbeddingInput, dimensions: int, shortened_to: int | None = None) -> np.ndarray:
    """A unit vector of `shortened_to or dimensions` float32 components, a function of `item` alone."""
    full = np.random.default_rng(_seed(item)).standard_normal(dimensions).astype(np.float32)
    v = full[: shortened_to or dimensions]
    return v / np.linalg.norm(v)


def sim_token_count(item: EmbeddingInput, chars_per_token: float) -> int:
    return len(item) if isinstance(item, list) else max(1, math.ceil(len(item) / chars_per_token))
