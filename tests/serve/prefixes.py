"""Prompts for routing tests, by name: a prompt named `name` of `n` tokens is the first `n` tokens of one endless
token sequence seeded by the name, so a longer prompt of the same name extends a shorter one (a follow-up re-sends its
document), and prompts of different names share nothing."""

from __future__ import annotations

import zlib

import numpy as np

from serve_app.routing.prefix_pages import page_hashes


def token_ids(name: str, tokens: int) -> np.ndarray:
    return np.random.default_rng(zlib.crc32(name.encode())).integers(0, 2**31, tokens)


def pages(name: str, tokens: int) -> tuple[int, ...]:
    return page_hashes(token_ids(name, tokens))


def held(prompts: dict[str, int] | None) -> frozenset[int]:
    """The pages a replica publishes when its engine holds these prompts (name -> tokens)."""
    return frozenset(p for name, tokens in (prompts or {}).items() for p in pages(name, tokens))
