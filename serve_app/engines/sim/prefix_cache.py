"""The sim engine's prefix cache: what it holds of past prompts and answers, by content, as sglang's radix cache.

Token ids are cut into blocks of `BLOCK_TOKENS`, each named by a chained hash (`routing.prefix_pages.page_hashes`:
a block's hash covers every token before it), so any prompt that starts with cached blocks reuses them, whichever
session or client sent it. Bounded by the KV pool in tokens; least recently used first, and always a block that no
other block extends (a radix tree evicts leaves first), so what is held of any prompt is a run from its start.

Like sglang's radix cache with `--kv-events-config`, it records its stores and evictions as KV events
(`replica.held_prefixes`: `BlockStored` with the blocks' token ids and the block they follow, `BlockRemoved`),
which the replica condenses for the router (`take_events`).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence

import numpy as np

from serve_app.replica.held_prefixes import BlockRemoved, BlockStored, KvEvent
from serve_app.routing.prefix_pages import TokenIds, held_pages, page_hashes

BLOCK_TOKENS = 16


class PrefixCache:
    def __init__(self, max_tokens: int, block_tokens: int = BLOCK_TOKENS) -> None:
        self.max_tokens = max_tokens
        self.block_tokens = block_tokens
        self._blocks: OrderedDict[int, int | None] = OrderedDict()
        """Block hash -> the block it extends (None: a prompt's first). Least recently used first, and every block
        after the blocks that extend it, so the first is always one no block extends."""
        self._extended_by: Counter[int] = Counter()
        self._events: list[KvEvent] = []

    @property
    def total_tokens(self) -> int:
        return len(self._blocks) * self.block_tokens

    def holds(self, token_ids: TokenIds) -> int:
        """Tokens of the prompt's prefix the cache holds (whole blocks), leaving what is evicted next as it is."""
        return held_pages(page_hashes(token_ids, self.block_tokens), self._blocks.__contains__) * self.block_tokens

    def blocks(self, token_ids: TokenIds, known: Sequence[int] = ()) -> tuple[int, ...]:
        """The chained hashes of the prompt's whole blocks (`known`: those of its first blocks, computed before)."""
        return page_hashes(token_ids, self.block_tokens, known)

    def match(self, token_ids: TokenIds, blocks: Sequence[int] | None = None) -> int:
        """Tokens of the prompt's prefix the cache holds (whole blocks); they count as used now. `blocks`: its
        `blocks`, if computed already."""
        hashes = self.blocks(token_ids) if blocks is None else blocks
        num = held_pages(hashes, self._blocks.__contains__)
        self._touch(hashes[:num])
        return num * self.block_tokens

    def store(self, token_ids: TokenIds, known: Sequence[int] = ()) -> None:
        """Cache a finished request's context (prompt and answer): its whole blocks not held yet. `known`: the
        hashes of its first blocks (its prompt's, from `blocks`), so a document is not hashed again."""
        hashes = self.blocks(token_ids, known)
        if len(hashes) * self.block_tokens > self.max_tokens:
            hashes = hashes[: self.max_tokens // self.block_tokens]
        held = held_pages(hashes, self._blocks.__contains__)
        parent = hashes[held - 1] if held else None
        if held < len(hashes):
            ids = np.asarray(token_ids, dtype=np.int64)
            new = hashes[held:]
            tokens = ids[held * self.block_tokens : len(hashes) * self.block_tokens]
            self._events.append(BlockStored(list(new), parent, tokens, self.block_tokens))
            for h in new:
                self._blocks[h] = parent
                if parent is not None:
                    self._extended_by[parent] += 1
                parent = h
        self._touch(hashes)
        self._evict()

    def _touch(self, hashes: Sequence[int]) -> None:
        for h in reversed(hashes):  # a prompt's first block last: newer than every block that extends it
            self._blocks.move_to_end(h)

    def _evict(self) -> None:
        removed: list[int] = []
        while self.total_tokens > self.max_tokens:
            h, parent = self._blocks.popitem(last=False)
            assert not self._extended_by[h], "the least recently used block is always a leaf"
            self._extended_by.pop(h, None)
            if parent is not None:
                self._extended_by[parent] -= 1
            removed.append(h)
        if removed:
            self._events.append(BlockRemoved(removed))

    def take_events(self) -> list[KvEvent]:
        """The KV events recorded since the last call."""
        events, self._events = self._events, []
        return events
