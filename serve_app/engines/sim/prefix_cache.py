"""Sessions' cached context on one replica, so a session's next prompt is matched as real prefix reuse.

A session's last context (prompt + answer) is kept as chained block hashes; a new prompt of the
session is matched block by block. LRU in sessions, bounded by the KV pool in tokens.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

CACHE_BLOCK_TOKENS = 64


class SessionPrefixCache:
    """Per-session cached context as chained block hashes; LRU in sessions, bounded in tokens."""

    def __init__(self, chars_per_token: float, max_sessions: int, max_tokens: int) -> None:
        self.block_chars = max(1, round(CACHE_BLOCK_TOKENS * chars_per_token))
        self.chars_per_token = chars_per_token
        self.max_sessions = max_sessions
        self.max_tokens = max_tokens
        self._blocks: OrderedDict[str, list[bytes]] = OrderedDict()
        self._tokens: dict[str, int] = {}
        self.total_tokens = 0

    def _hashes(self, text: str, limit: int | None = None) -> list[bytes]:
        out: list[bytes] = []
        h = b""
        n = len(text) // self.block_chars
        for i in range(n if limit is None else min(n, limit)):
            block = text[i * self.block_chars : (i + 1) * self.block_chars]
            h = hashlib.blake2b(h + block.encode(), digest_size=16).digest()
            out.append(h)
        return out

    def match(self, session: str | None, text: str) -> int:
        """Tokens of `text`'s prefix that the session's cached context covers."""
        if not session or session not in self._blocks:
            return 0
        cached = self._blocks[session]
        self._blocks.move_to_end(session)
        num = 0
        for a, b in zip(self._hashes(text, len(cached)), cached, strict=False):
            if a != b:
                break
            num += 1
        return min(self._tokens[session], int(num * self.block_chars / self.chars_per_token))

    def store(self, session: str | None, text: str, num_tokens: int) -> None:
        if not session or self.max_sessions == 0:
            return
        self.drop(session)
        num_tokens = min(num_tokens, self.max_tokens)
        self._blocks[session] = self._hashes(text)
        self._tokens[session] = num_tokens
        self.total_tokens += num_tokens
        while self._blocks and (len(self._blocks) > self.max_sessions or self.total_tokens > self.max_tokens):
            self.drop(next(iter(self._blocks)))

    def drop(self, session: str) -> None:
        if self._blocks.pop(session, None) is not None:
            self.total_tokens -= self._tokens.pop(session)

    def tokens(self, session: str) -> int:
        return self._tokens.get(session, 0)

    @property
    def num_sessions(self) -> int:
        return len(self._blocks)

    def recent(self, limit: int) -> dict[str, int]:
        """Cached tokens of the `limit` most recently used sessions."""
        out: dict[str, int] = {}
        for s in reversed(self._blocks):
            if len(out) >= limit:
                break
            out[s] = self._tokens[s]
        return out

    def resize(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        while len(self._blocks) > max_sessions:
            self.drop(next(iter(self._blocks)))
