"""What a replica's engine holds in its prefix cache, condensed from the engine's own KV events for the router.

Engines record their cache's stores and evictions as KV events: sglang's radix cache with `--kv-events-config`
(`BlockStored`, `BlockRemoved`, `AllBlocksCleared` in `sglang.srt.disaggregation.kv_events`, the stream Dynamo and
llm-d consume), the sim engine's prefix cache the same three (`engines.sim.prefix_cache`). A store names its blocks'
hashes, the block it follows and the blocks' token ids. `HeldPrefixes` replays them: it rebuilds each stored token
sequence from its parent chain, cuts it into the router's pages (`routing.prefix_pages`, whatever the engine's
block size) and keeps the set of router pages the engine holds, a page held while the engine block that completes
it is. Evictions drop pages at once: an evicted prefix stops attracting requests at the next publication.

Bounded by the engine's pool: one entry per engine block held. Events whose parent it never saw (the replica
subscribed late, or the stream dropped some) are skipped, and so is everything stored after them on that chain:
the replica then under-reports, and the router's own record of what it sent fills in.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from serve_app.routing.prefix_pages import PAGE_TOKENS, ROOT, TokenIds, as_int, next_page_hash

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Engine blocks stored, in order, each of `block_size` tokens; the first follows `parent` (None: the root)."""

    block_hashes: Sequence[int]
    parent: int | None
    token_ids: TokenIds
    block_size: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: Sequence[int]


@dataclass(frozen=True, slots=True)
class AllCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllCleared


@dataclass(slots=True)
class _Run:
    """One stored event's tokens, with the router pages completed in them."""

    start_hash: bytes
    """The chain hash of the last whole router page before the run."""
    start_tail: tuple[int, ...]
    """Tokens after that page and before the run (fewer than a page)."""
    tokens: TokenIds
    page_ends: list[int] = field(default_factory=list)
    """Offset into `tokens` where each completed router page ends."""
    page_hashes: list[bytes] = field(default_factory=list)

    def state_at(self, offset: int) -> tuple[bytes, tuple[int, ...]]:
        """The chain hash and the tail after the run's first `offset` tokens."""
        done = bisect_right(self.page_ends, offset)
        if not done:
            return self.start_hash, (*self.start_tail, *self.tokens[:offset])
        return self.page_hashes[done - 1], tuple(self.tokens[self.page_ends[done - 1] : offset])

    def pages_ending_in(self, begin: int, end: int) -> range:
        """Indexes of the router pages whose last token is in the run's tokens `[begin, end)`."""
        return range(bisect_right(self.page_ends, begin), bisect_right(self.page_ends, end))


def _run(start_hash: bytes, start_tail: tuple[int, ...], tokens: TokenIds, page_tokens: int) -> _Run:
    run = _Run(start_hash, start_tail, tokens)
    # The tail and the run as one buffer of int64s, each page a slice of it: a 100k-token document is ~1,500 pages,
    # replayed on the replica's event loop when it is published.
    data = np.concatenate([np.asarray(start_tail, dtype=np.int64), np.asarray(tokens, dtype=np.int64)]).tobytes()
    h = start_hash
    for end in range(page_tokens, len(start_tail) + len(tokens) + 1, page_tokens):
        h = next_page_hash(h, data[(end - page_tokens) * 8 : end * 8])
        run.page_ends.append(end - len(start_tail))
        run.page_hashes.append(h)
    return run


class HeldPrefixes:
    """The router pages an engine holds, replayed from its KV events."""

    def __init__(self, page_tokens: int = PAGE_TOKENS) -> None:
        self.page_tokens = page_tokens
        self._blocks: dict[int, tuple[_Run, int, int]] = {}
        """Engine block hash -> its run, and the run offsets of its first token and past its last."""
        self._held: OrderedDict[int, int] = OrderedDict()
        """Router page (published form) -> engine blocks completing it. Most recently stored last, and every page
        after the pages it extends (they are touched again when it is stored): any tail of this order is a set of
        prefixes, each from its start."""
        self._parent: dict[int, int | None] = {}
        """Router page -> the page it extends (None: the first page of a prompt)."""
        self.num_skipped = 0
        """Stored blocks skipped: their parent was never seen."""

    def apply(self, events: Iterable[KvEvent]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                self._stored(event)
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    self._removed(h)
            else:
                self._blocks.clear()
                self._held.clear()
                self._parent.clear()

    def _stored(self, event: BlockStored) -> None:
        if event.parent is None:
            start: tuple[bytes, tuple[int, ...]] = (ROOT, ())
        elif event.parent in self._blocks:
            run, _, end = self._blocks[event.parent]
            start = run.state_at(end)
        else:
            self.num_skipped += len(event.block_hashes)
            return
        run = _run(*start, event.token_ids, self.page_tokens)
        pages = [as_int(ph) for ph in run.page_hashes]
        size, ends, completed = event.block_size, run.page_ends, 0
        for i, h in enumerate(event.block_hashes):
            if h in self._blocks:
                self._removed(h)  # stored again (the engine re-inserted it): count it once
            end = min((i + 1) * size, len(event.token_ids))
            self._blocks[h] = (run, i * size, end)
            while completed < len(ends) and ends[completed] <= end:  # the pages this block completes (`_pages_in`)
                self._held[pages[completed]] = self._held.get(pages[completed], 0) + 1
                completed += 1
        previous = None if run.start_hash == ROOT else as_int(run.start_hash)
        for page in pages:
            self._parent.setdefault(page, previous)
            previous = page
        self._touch(pages[-1] if pages else previous)

    def _touch(self, page: int | None) -> None:
        """Make `page` and every page before it on its chain the most recent, its first page last."""
        while page is not None and page in self._held:
            self._held.move_to_end(page)
            page = self._parent.get(page)

    def _pages_in(self, block_hash: int) -> list[int]:
        run, begin, end = self._blocks[block_hash]
        return [as_int(run.page_hashes[i]) for i in run.pages_ending_in(begin, end)]

    def _removed(self, block_hash: int) -> None:
        if block_hash not in self._blocks:
            return
        for page in self._pages_in(block_hash):
            count = self._held.get(page, 0) - 1
            if count > 0:
                self._held[page] = count
            else:
                self._held.pop(page, None)
                self._parent.pop(page, None)
        del self._blocks[block_hash]

    def published(self, limit: int) -> list[int]:
        """The `limit` most recently stored pages held: whole prefixes, each from its first page."""
        if limit <= 0:
            return []
        keys = list(self._held)
        return keys[-limit:]

    @property
    def num_pages(self) -> int:
        return len(self._held)

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)
