"""What a replica publishes its engine holds, from real sglang's KV events (CPU, tiny model): the sglang backend
started as a replica starts it, in a child process group (`held_prefixes_driver`). A chat's router pages, computed
from its prompt tokenized as the ingress tokenizes it, are published once sglang has stored the prompt, and are gone
once other chats have filled the KV pool and sglang evicted it. Asserted on the published sets after each chat,
never on timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cpu_env import CPU_ENGINE_KWARGS, REPO_ROOT, cpu_sglang_env
from harness.sglang_engine import kill_group, log_tail

pytestmark = [pytest.mark.sglang_cpu, pytest.mark.timeout(1200)]  # an engine start on a loaded 2-core CPU

POOL_TOKENS = 1024
CHAT_WORDS = 300
"""One token per word (the tiny model's word-level tokenizer): about 300 prompt tokens a chat, 4 router pages."""
OTHER_CHATS = 6
"""Their prompts alone fill the pool nearly twice: sglang evicts the least recently used first, the first chat."""
RUN_TIMEOUT_S = 900


def chat(first_word: int) -> list[dict[str, str]]:
    """A prompt no other chat shares beyond the chat template's first tokens."""
    return [{"role": "user", "content": " ".join(f"w{first_word + i}" for i in range(CHAT_WORDS))}]


def run_driver(model_dir: Path, chats: list[list[dict[str, str]]], work_dir: Path) -> dict:
    args = {
        "backend": "sglang",
        "model_id": "tiny-llama",
        "sglang": {
            "model_path": str(model_dir),
            "context_length": 4096,
            "engine_args": {**CPU_ENGINE_KWARGS, "max_total_tokens": POOL_TOKENS},
        },
    }
    work_dir.mkdir(parents=True, exist_ok=True)
    job, result, log = work_dir / "job.json", work_dir / "result.json", work_dir / "driver.log"
    job.write_text(json.dumps({"args": args, "chats": chats}))
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.sglang_cpu.held_prefixes_driver", str(job), str(result)],
            cwd=REPO_ROOT,
            env=cpu_sglang_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        rc = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        kill_group(proc)
    assert rc == 0 and result.exists(), f"driver exited with {rc}; log tail:\n{log_tail(log)}"
    return json.loads(result.read_text())


def test_a_chats_pages_are_published_while_sglang_holds_them(tiny_model_dir, tmp_path):
    chats = [chat(10 + 100 * k) for k in range(1 + OTHER_CHATS)]
    assert len({c[0]["content"].split()[0] for c in chats}) == len(chats)
    run = run_driver(tiny_model_dir, chats, tmp_path / "driver")
    steps = run["steps"]
    assert [s["status"] for s in steps] == [200] * len(chats)
    first, last = steps[0], steps[-1]
    assert len(first["pages"]) == 4  # the template's tokens and 300 words: 4 whole pages of 64
    assert set(first["pages"]) <= set(first["held"])  # published once sglang stored it
    every_chats_pages = {page for step in steps for page in step["pages"]}
    for step in steps:
        assert set(step["pages"]) <= set(step["held"])  # each chat in turn
        assert set(step["held"]) <= every_chats_pages  # nothing else: the ingress's token ids are sglang's
        assert len(step["held"]) <= POOL_TOKENS // 64  # never more than the pool can hold
    assert not set(first["pages"]) & set(last["held"])  # evicted by the others: unpublished
    held = run["describe"]["held_prefixes"]
    assert held["skipped_blocks"] == 0 and held["lost_event_batches"] == 0
    assert held["event_batches"] > 0
