"""`HeldPrefixes` against a model engine: a radix tree of fixed-size blocks that stores prompts sharing prefixes and
evicts leaves first, as sglang's radix cache does, recording the KV events it would publish. What the replica
publishes must be exactly the router pages (`page_hashes`) of the token prefixes the engine holds, computed here
from the model's own tree, never from `HeldPrefixes`' state."""

from __future__ import annotations

import hashlib
import itertools
import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.replica.held_prefixes import AllCleared, BlockRemoved, BlockStored, HeldPrefixes, KvEvent
from serve_app.routing.prefix_pages import PAGE_TOKENS, page_hashes
from tests.hypothesis_budget import examples


def block_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    """A content hash covering the block's whole prefix, as an engine's (a signed 64-bit int, as sglang's)."""
    data = repr((parent, tokens)).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


@dataclass
class ModelEngine:
    """Blocks of `block_size` tokens in a tree; each block names its parent. Only whole blocks are cached."""

    block_size: int
    parent: dict[int, int | None] = field(default_factory=dict)
    tokens: dict[int, tuple[int, ...]] = field(default_factory=dict)
    children: dict[int, int] = field(default_factory=dict)
    events: list[KvEvent] = field(default_factory=list)

    def store(self, token_ids: list[int], cuts: list[int]) -> None:
        """Cache `token_ids`' whole blocks; the new ones go out as one event per run between `cuts` (block indexes
        where the engine's coalescing broke the chain: chunked prefill, another request's events in between)."""
        size = self.block_size
        chain: list[tuple[int, tuple[int, ...]]] = []
        parent: int | None = None
        for start in range(0, len(token_ids) - size + 1, size):
            block = tuple(token_ids[start : start + size])
            h = block_hash(parent, block)
            chain.append((h, block))
            parent = h
        first_new = next((i for i, (h, _) in enumerate(chain) if h not in self.parent), len(chain))
        new = chain[first_new:]
        bounds = sorted({0, len(new), *(c for c in cuts if 0 < c < len(new))})
        previous = chain[first_new - 1][0] if first_new else None
        for lo, hi in itertools.pairwise(bounds):
            run = new[lo:hi]
            hashes = [h for h, _ in run]
            tokens = [t for _, block in run for t in block]
            self.events.append(BlockStored(hashes, previous, tokens, size))
            for h, block in run:
                self.parent[h] = previous
                self.tokens[h] = block
                self.children[h] = 0
                if previous is not None:
                    self.children[previous] += 1
                previous = h

    def evict(self, pick: int, chain_length: int, leaf_first: bool) -> None:
        """Evict a leaf and up to `chain_length - 1` blocks above it that it leaves childless, in one event (sglang
        removes a whole radix node: its blocks in order; the order inside one event does not matter)."""
        leaves = sorted(h for h, n in self.children.items() if n == 0)
        if not leaves:
            return
        h: int | None = leaves[pick % len(leaves)]
        removed: list[int] = []
        while h is not None and len(removed) < chain_length and self.children[h] == 0:
            parent = self.parent.pop(h)
            del self.tokens[h], self.children[h]
            if parent is not None:
                self.children[parent] -= 1
            removed.append(h)
            h = parent
        self.events.append(BlockRemoved(removed if leaf_first else removed[::-1]))

    def clear(self) -> None:
        self.parent.clear()
        self.tokens.clear()
        self.children.clear()
        self.events.append(AllCleared())

    def prefix(self, h: int) -> list[int]:
        """The tokens from the root through block `h`."""
        blocks: list[tuple[int, ...]] = []
        cur: int | None = h
        while cur is not None:
            blocks.append(self.tokens[cur])
            cur = self.parent[cur]
        return [t for block in reversed(blocks) for t in block]

    def held_pages(self) -> tuple[set[int], dict[int, int | None]]:
        """The router pages of every held prefix, and each page's predecessor on its chain."""
        pages: set[int] = set()
        before: dict[int, int | None] = {}
        for h in self.parent:
            chain = page_hashes(self.prefix(h))
            pages.update(chain)
            for i, page in enumerate(chain):
                before[page] = chain[i - 1] if i else None
        return pages, before


store_op = st.tuples(
    st.just("store"),
    st.integers(0, 10**6),  # which earlier prompt to share a prefix with (none when there is none)
    st.floats(0, 1),  # how much of it
    st.integers(0, 400),  # then this many new tokens
    st.integers(0, 2**32),  # drawn from this seed
    st.lists(st.integers(1, 100), max_size=4),  # where the store's chain is cut into events
)
evict_op = st.tuples(st.just("evict"), st.integers(0, 10**6), st.integers(1, 30), st.booleans())
clear_op = st.tuples(st.just("clear"))
ops_st = st.lists(st.one_of(store_op, store_op, evict_op, evict_op, clear_op), max_size=25)


@settings(deadline=None, max_examples=examples(300))
@given(block_size=st.integers(1, 20), ops=ops_st, apply_every=st.integers(1, 4))
def test_published_pages_are_exactly_the_held_prefixes_pages(block_size: int, ops: list, apply_every: int) -> None:
    engine = ModelEngine(block_size)
    held = HeldPrefixes()
    prompts: list[list[int]] = []
    for i, op in enumerate(ops):
        if op[0] == "store":
            _, base, share, length, seed, cuts = op
            shared = prompts[base % len(prompts)] if prompts else []
            extra = random.Random(seed).choices(range(1000), k=length)
            prompt = shared[: int(len(shared) * share)] + extra
            prompts.append(prompt)
            engine.store(prompt, cuts)
        elif op[0] == "evict":
            engine.evict(*op[1:])
        else:
            engine.clear()
        if (i + 1) % apply_every and i + 1 < len(ops):
            continue  # events arrive in batches: check after each batch, not after each event
        held.apply(engine.events)
        engine.events.clear()

        expected, before = engine.held_pages()
        everything = held.published(len(expected) + 10)
        assert len(everything) == len(set(everything))
        assert set(everything) == expected
        assert held.num_skipped == 0
        assert held.num_blocks == len(engine.parent)
        assert held.num_pages <= held.num_blocks  # blocks <= 20 tokens: each completes at most one router page
        for limit in range(len(expected) + 2):
            some = held.published(limit)
            assert len(some) == min(limit, len(expected))
            closed = set(some)
            assert all(before[p] is None or before[p] in closed for p in some), limit


def test_a_page_spanning_blocks_is_held_while_its_last_block_is() -> None:
    assert PAGE_TOKENS == 64  # the block size below puts page ends inside blocks
    engine = ModelEngine(block_size=48)  # pages end inside the second and third blocks
    engine.store(list(range(3 * 48)), cuts=[1])
    held = HeldPrefixes()
    held.apply(engine.events)
    pages = page_hashes(list(range(3 * 48)))
    assert len(pages) == 2 and set(held.published(10)) == set(pages)
    engine.events.clear()
    engine.evict(0, 1, True)  # the third block completes page 2 (tokens 64..127 end at 127 < 144)
    held.apply(engine.events)
    assert set(held.published(10)) == {pages[0]}
    assert held.published(1) == [pages[0]]
