"""Requests to a real sglang server from tests: background generations and waiting on the pass trace."""

from __future__ import annotations

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
