"""Run in a child process (`test_held_prefixes_sglang`): the sglang backend on real sglang, chats sent one by one.

    python -m tests.sglang_cpu.held_prefixes_driver JOB.json RESULT.json

The job holds the app's `args` and a list of chats (each a `messages` list). The backend starts its engine as a
replica does (`SglangBackend.start`: sglang's KV events on the backend's own endpoint); each chat goes through
`respond`, then the driver waits, with a deadline, until every router page of that chat's prompt (tokenized as the
ingress does) is in `held_prefixes`: the engine's events up to its store have then been replayed, and with them
every eviction before it. The result holds each chat's pages, what the replica published after it, and the
backend's admin view.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

PUBLISHED_LIMIT = 100_000
"""More than the pool can hold: every held page."""
DEADLINE_S = 120
"""For one chat's pages to appear (a pass and a publication on loaded cores: seconds at most)."""


async def chat_status(backend: Any, request: Any) -> int:
    from serve_app.replica.backend import ResponseStart

    status = 0
    async for batch in backend.respond(request):
        for part in batch:
            if isinstance(part, ResponseStart):
                status = part.status
    return status


async def run(job: dict[str, Any]) -> dict[str, Any]:
    from serve_app.config import AppConfig, EngineKnobs, validate
    from serve_app.engines.sglang.sglang_backend import SglangBackend
    from serve_app.replica.backend import OpenAIRequest
    from serve_app.routing.prefix_pages import page_hashes
    from serve_app.tokenizer import HFTokenizer

    cfg = validate(AppConfig, job["args"], "args")
    tokenizer = HFTokenizer(cfg.sglang.model_path)
    backend = SglangBackend(cfg, EngineKnobs())
    await backend.start()
    steps: list[dict[str, Any]] = []
    try:
        for i, messages in enumerate(job["chats"]):
            body = {"model": cfg.served_model_id, "messages": messages, "max_tokens": 2}
            status = await chat_status(backend, OpenAIRequest("chat", body, f"chat-{i}"))
            pages = list(page_hashes(tokenizer.chat_ids(messages)))
            deadline = time.monotonic() + DEADLINE_S
            held = set(backend.held_prefixes(PUBLISHED_LIMIT))
            while not set(pages) <= held and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                held = set(backend.held_prefixes(PUBLISHED_LIMIT))
            steps.append({"status": status, "pages": pages, "held": sorted(held)})
        return {"steps": steps, "describe": backend.describe()}
    finally:
        await backend.shutdown()


def main(job_path: str, result_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    result = asyncio.run(run(job))
    Path(result_path).write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
