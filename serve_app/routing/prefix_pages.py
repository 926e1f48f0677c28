"""A prompt's prefix as chained page hashes: how the router knows how much of a prompt each replica holds.

A prompt's token ids (after the chat template: the ingress renders and tokenizes as the engine does) are cut into
pages of `PAGE_TOKENS`; page `i`'s hash covers pages `0..i` (each hash chains the one before), so one hash names a
whole prefix. Each replica publishes the hashes of the pages its engine holds (`replica.held_prefixes` condenses
the engine's own KV events into them); a replica holds a request's first `held_tokens` tokens. An engine evicts
a prefix from its end (a radix tree evicts leaves first), so the held pages of a prompt are always a run from its
start: the longest held prefix is found by bisection.

Published state is up to a stats period old. `SentPrefixes` is the router's own record of the pages it sent each
replica since (as sglang-router's `cache_aware` builds its whole tree from what it sent): a finished request's prompt
counts as held where it was sent until a publication made after it says otherwise, the engine's word. A request still
in flight does not count: its prompt is being prefilled, and a second copy of it sent now would wait for (sglang) or
repeat (the sim engine, which caches a request when it ends) that work, so it is neither cheap nor within limits.

The page size is the router's, not the engine's (sglang pages are 1 token on most backends, the sim engine's 16):
the replica rebuilds these pages from the token ids the engine's events carry, so they stay in step with the engine
whatever its page size, as long as the ingress produces the same token ids as the engine.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable, Sequence

import numpy as np

TokenIds = Sequence[int] | np.ndarray
"""A prompt's token ids: a list from a model's tokenizer, an array from the sim's."""

PAGE_TOKENS = 64
"""Tokens per router page: a held prefix is counted to within this many tokens."""
ROOT = b""
"""The chain state before the first page."""


def next_page_hash(previous: bytes, page: Sequence[int] | np.ndarray | bytes) -> bytes:
    """The hash of a page whose prefix hashes to `previous`: the one hash function of the scheme. `page`: its token
    ids, or their bytes as int64s."""
    data = page if isinstance(page, bytes) else np.asarray(page, dtype=np.int64).tobytes()
    return hashlib.blake2b(previous + data, digest_size=8).digest()


def as_int(page_hash: bytes) -> int:
    """The published form of a page hash (an int pickles small and hashes fast in a set)."""
    return int.from_bytes(page_hash, "little", signed=True)


def as_bytes(page: int) -> bytes:
    """The chain state a published page hash stands for (`as_int`'s inverse)."""
    return page.to_bytes(8, "little", signed=True)


def page_hashes(token_ids: TokenIds, page_tokens: int = PAGE_TOKENS, known: Sequence[int] = ()) -> tuple[int, ...]:
    """The chained hashes of the whole pages of `token_ids` (a partial last page has none). `known`: those of its
    first pages, already computed (a prompt's, when its answer is appended): only the pages after them are hashed."""
    ids = np.asarray(token_ids, dtype=np.int64)
    out: list[int] = list(known)
    h = as_bytes(known[-1]) if known else ROOT
    for start in range(len(known) * page_tokens, len(ids) - page_tokens + 1, page_tokens):
        h = next_page_hash(h, ids[start : start + page_tokens])
        out.append(as_int(h))
    return tuple(out)


def held_pages(pages: Sequence[int], held: Callable[[int], bool]) -> int:
    """How many of `pages` (a prompt's chained hashes) are held: the longest run from the start, by bisection."""
    lo, hi = 0, len(pages)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if held(pages[mid - 1]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def held_tokens(pages: Sequence[int], published: Container[int], page_tokens: int = PAGE_TOKENS) -> int:
    """Tokens of a prompt's prefix a replica that published `published` holds."""
    return held_pages(pages, published.__contains__) * page_tokens


UNFINISHED = float("-inf")


class SentPrefixes:
    """The pages this router sent each replica, for as long as its publications may not show them yet.

    Bounded: at most `max_pages` pages per replica (the least recently sent go first), and only the replicas
    named in the last `forget_others` call."""

    def __init__(self, max_pages: int = 65_536) -> None:
        self.max_pages = max_pages
        self._by_replica: dict[str, OrderedDict[int, float]] = {}
        """Replica -> page -> when the last request that sent it finished (`UNFINISHED` until one does)."""

    def sent(self, replica_id: str, pages: Iterable[int]) -> None:
        od = self._by_replica.setdefault(replica_id, OrderedDict())
        # Newest last, a prompt's first page newest of all: the least recently sent go first, and a prompt's last
        # pages before its first, so what is left of a prompt is still a run from its start.
        for p in reversed(list(pages)):
            od[p] = od.get(p, UNFINISHED)
            od.move_to_end(p)
        while len(od) > self.max_pages:
            od.popitem(last=False)

    def finished(self, replica_id: str, pages: Iterable[int], now_s: float) -> None:
        od = self._by_replica.get(replica_id)
        if od is None:
            return
        for p in pages:
            if p in od:
                od[p] = now_s

    def holder(self, replica_id: str, published: Container[int], published_s: float) -> Callable[[int], bool]:
        """Whether the replica holds a page: it published it, or a request this router sent there with it has
        finished and no publication has been made since (one made after it is the engine's word: evicted, or never
        stored)."""
        od = self._by_replica.get(replica_id)
        if not od:
            return published.__contains__

        def held(page: int) -> bool:
            return page in published or od.get(page, UNFINISHED) >= published_s

        return held

    def forget_others(self, replica_ids: Container[str]) -> None:
        """Drop the record of replicas that are gone."""
        for rid in [r for r in self._by_replica if r not in replica_ids]:
            del self._by_replica[rid]

    def size(self) -> int:
        return sum(len(od) for od in self._by_replica.values())
