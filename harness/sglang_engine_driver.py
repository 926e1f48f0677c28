"""Run in a child process (see `sglang_engine.run_engine`): an in-process `sglang.Engine` serving a job.

    python sglang_engine_driver.py JOB.json RESULT.json

The job names the model, the `sglang.Engine` keyword arguments and batches of token-id prompts (with optional
request ids, ``rid``). Each batch goes to the engine as one call (sglang sends a batch of token ids to the
scheduler as one message, so every request of a batch is queued before the scheduler's next pass).

Batches run in groups, one group after another: a group starts once the one before it has finished. By default
each batch is a group of its own. Batches that share a ``group`` number arrive while the group runs: the first at
once, each later one when the engine is ``after_passes`` forward passes into the group, as the pass trace shows
(``pass_trace``: the file the plugin, or the upstream trace with the plugin off, writes), or when every request
sent so far has finished, whichever comes first. Which pass a batch lands in is up to the engine's timing; the
trace records it (each record's ``arrived``), so a comparison replays the arrivals where they landed.

The result holds each batch's outputs (``output_ids`` and ``meta_info``), whether it was sent to an engine with
nothing left to run (``sent_idle``: the first of a group, or a later one whose passes never came), and, if asked,
a few of sglang's own counters after the run.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from pathlib import Path
from typing import Any

POLL_S = 0.002


class TraceTail:
    """The forward passes of the records appended to the pass trace since it was opened, read incrementally."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.offset = path.stat().st_size if path is not None and path.exists() else 0
        self.first_pass: int | None = None
        self.last_pass: int | None = None
        self._partial = b""

    def read(self) -> None:
        if self.path is None or not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            record = json.loads(line)
            if "pass" not in record:
                continue  # a timed pass (`pass_trace.timing_record`), not a planned one
            forward_pass = record["forward_pass"]
            self.first_pass = forward_pass if self.first_pass is None else self.first_pass
            self.last_pass = forward_pass

    def passes_seen(self) -> int:
        self.read()
        return 0 if self.first_pass is None else self.last_pass - self.first_pass


async def wait_for_pass(tail: TraceTail, after_passes: int, sent: list[asyncio.Task]) -> bool:
    """Until the group is `after_passes` forward passes past its first traced pass, or nothing sent is running.
    True in the second case: every request sent before had finished (the engine had nothing left to run)."""
    while not all(task.done() for task in sent):
        if tail.passes_seen() >= after_passes:
            return False
        await asyncio.sleep(POLL_S)
    return True


async def run_group(engine: Any, batches: list[dict[str, Any]], trace: Path | None) -> list[dict[str, Any]]:
    """Each batch's outputs, and whether it was sent to an engine with nothing left to run (``sent_idle``)."""
    tail = TraceTail(trace)
    sent: list[asyncio.Task] = []
    idle: list[bool] = []
    for batch in batches:
        idle.append(await wait_for_pass(tail, int(batch.get("after_passes", 0)), sent))
        call = engine.async_generate(
            input_ids=batch["input_ids"], sampling_params=batch["sampling_params"], rid=batch.get("rid")
        )
        sent.append(asyncio.ensure_future(call))
    outputs = await asyncio.gather(*sent)
    return [
        {"outputs": [{"output_ids": o["output_ids"], "meta_info": o["meta_info"]} for o in out], "sent_idle": was_idle}
        for out, was_idle in zip(outputs, idle, strict=True)
    ]


def main(job_path: str, result_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    import sglang

    trace = Path(job["pass_trace"]) if job.get("pass_trace") else None
    engine = sglang.Engine(model_path=job["model_path"], **job["engine"])
    try:
        done = []
        numbered = [(batch.get("group", i), batch) for i, batch in enumerate(job["batches"])]
        for _, group in itertools.groupby(numbered, key=lambda item: item[0]):
            batches = [batch for _, batch in group]
            done += engine.loop.run_until_complete(run_group(engine, batches, trace))
        result = {"outputs": [d["outputs"] for d in done], "sent_idle": [d["sent_idle"] for d in done]}
        if job.get("server_info"):
            info = engine.get_server_info()
            result["server_info"] = {k: info.get(k) for k in ("max_total_num_tokens", "max_running_requests")}
        Path(result_path).write_text(json.dumps(result, default=str))
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
