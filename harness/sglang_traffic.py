"""Requests to a real sglang server from tests and benchmarks: background generations (whole or streamed), streamed
OpenAI completions, and waiting on the pass trace."""

from __future__ import annotations

import http.client
import itertools
import json
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.sglang_server import LocalServer
from scheduler.pass_trace import read_pass_trace

FIRST_WORD_ID = 5
"""Token ids below this are the tiny tokenizer's special tokens."""


def prompt_ids(n: int, seed: int, vocab: int = 1_000) -> list[int]:
    """Distinct random ids per seed: no prefix-cache hits between requests."""
    rng = random.Random(seed)
    return [rng.randrange(FIRST_WORD_ID, vocab) for _ in range(n)]


def greedy(max_new_tokens: int) -> dict[str, Any]:
    return {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}


class Generation(threading.Thread):
    """One ``/generate`` call in the background; `result` (the JSON answer) or `error` once joined."""

    def __init__(self, server: LocalServer, rid: str, ids: list[int], max_new_tokens: int) -> None:
        super().__init__(daemon=True, name=f"generate-{rid}")
        self.server, self.rid, self.ids, self.max_new_tokens = server, rid, ids, max_new_tokens
        self.result: dict[str, Any] | None = None
        self.error: str | None = None
        self.start()

    def run(self) -> None:
        body = {"rid": self.rid, "input_ids": self.ids, "sampling_params": greedy(self.max_new_tokens)}
        try:
            self.result = self.server.request("POST", "/generate", body, timeout_s=240)
        except Exception as e:  # the test asserts on it
            self.error = repr(e)

    def finish(self, timeout_s: float = 240) -> dict[str, Any]:
        self.join(timeout_s)
        assert not self.is_alive(), f"{self.rid}: no answer after {timeout_s} s"
        assert self.error is None, f"{self.rid}: {self.error}"
        return self.result

    @property
    def finish_reason(self) -> str:
        return self.finish()["meta_info"]["finish_reason"]["type"]


class StreamedGeneration(threading.Thread):
    """One streamed ``/generate`` in the background: when it was sent, and the arrival time (``time.monotonic()``)
    and cumulative completion tokens of every streamed chunk."""

    def __init__(self, port: int, rid: str, ids: list[int], max_new_tokens: int, timeout_s: float = 600) -> None:
        super().__init__(daemon=True, name=f"stream-{rid}")
        self.port, self.rid, self.ids, self.max_new_tokens, self.timeout_s = port, rid, ids, max_new_tokens, timeout_s
        self.sent_s: float | None = None
        self.chunks: list[tuple[float, int]] = []
        self.error: str | None = None
        self.start()

    def run(self) -> None:
        body = {"rid": self.rid, "input_ids": self.ids, "stream": True, "sampling_params": greedy(self.max_new_tokens)}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout_s)
        try:
            self.sent_s = time.monotonic()
            conn.request("POST", "/generate", body=json.dumps(body), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
            for raw in resp:
                line = raw.strip()
                if line.startswith(b"data:") and line != b"data: [DONE]":
                    self.chunks.append((time.monotonic(), json.loads(line[5:])["meta_info"]["completion_tokens"]))
        except Exception as e:  # the caller reports it
            self.error = repr(e)
        finally:
            conn.close()

    def tokens(self) -> int:
        return self.chunks[-1][1] if self.chunks else 0

    @property
    def ttft_s(self) -> float | None:
        """Send to the first chunk that carries a token."""
        first = next((t for t, n in self.chunks if n > 0), None)
        return None if first is None or self.sent_s is None else first - self.sent_s

    def gaps_s(self) -> list[float]:
        """The time between tokens: each later chunk's gap since the one before, spread over its new tokens (one
        figure per chunk, as the Serve app's `StreamTimer` observes them)."""
        return [(t1 - t0) / (n1 - n0) for (t0, n0), (t1, n1) in itertools.pairwise(self.chunks) if n1 > n0 and n0 > 0]

    def finish(self, timeout_s: float = 600) -> StreamedGeneration:
        self.join(timeout_s)
        if self.is_alive() or self.error is not None:
            raise RuntimeError(f"{self.rid}: {self.error or f'no end after {timeout_s} s'}")
        return self


class StreamedCompletion(threading.Thread):
    """One streamed OpenAI ``/v1/completions`` call in the background, its prompt as token ids and its own request
    id, with `headers` (a tenant's ``x-smg-routing-key``): when it was sent, and when each streamed chunk arrived."""

    def __init__(
        self,
        port: int,
        rid: str,
        ids: list[int],
        max_tokens: int,
        headers: dict[str, str] | None = None,
        timeout_s: float = 600,
    ) -> None:
        super().__init__(daemon=True, name=f"completion-{rid}")
        self.port, self.rid, self.ids, self.max_tokens, self.timeout_s = port, rid, ids, max_tokens, timeout_s
        self.headers = headers or {}
        self.sent_s: float | None = None
        self.chunk_s: list[float] = []
        self.error: str | None = None
        self.start()

    def run(self) -> None:
        body = {"model": "default", "prompt": self.ids, "max_tokens": self.max_tokens, "stream": True}
        body |= {"temperature": 0.0, "ignore_eos": True, "rid": self.rid}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout_s)
        try:
            self.sent_s = time.monotonic()
            headers = {"Content-Type": "application/json", **self.headers}
            conn.request("POST", "/v1/completions", body=json.dumps(body), headers=headers)
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
            for raw in resp:
                line = raw.strip()
                if line.startswith(b'data: {"error"'):
                    raise RuntimeError(line[:300].decode(errors="replace"))
                if line.startswith(b"data:") and line != b"data: [DONE]":
                    self.chunk_s.append(time.monotonic())
        except Exception as e:  # the caller reports it
            self.error = repr(e)
        finally:
            conn.close()

    @property
    def ttft_s(self) -> float | None:
        """Send to the first streamed chunk (sglang streams a completion's first token in its first chunk)."""
        return None if not self.chunk_s or self.sent_s is None else self.chunk_s[0] - self.sent_s

    def finish(self, timeout_s: float = 600) -> StreamedCompletion:
        self.join(timeout_s)
        if self.is_alive() or self.error is not None:
            raise RuntimeError(f"{self.rid}: {self.error or f'no end after {timeout_s} s'}")
        return self


def wait_for(
    what: str, check: Callable[[], Any], timeout_s: float = 120, poll_s: float = 0.005, on_timeout: str = ""
) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{on_timeout}")


def trace_since(path: Path, start: int) -> list[dict[str, Any]]:
    return read_pass_trace(path)[start:]


def load(server: LocalServer) -> dict[str, Any]:
    """sglang's own counters (``/v1/loads``): used KV tokens, running and waiting requests."""
    (rank0,) = server.request("GET", "/v1/loads")["loads"]
    return rank0


def wait_idle(server: LocalServer, timeout_s: float = 120) -> dict[str, Any]:
    def idle():
        now = load(server)
        return now if now["num_running_reqs"] == 0 and now["num_waiting_reqs"] == 0 else None

    return wait_for("the server to go idle", idle, timeout_s, poll_s=0.1)
