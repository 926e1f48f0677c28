"""Run in a child process (see `engine.run_engine`): an in-process `sglang.Engine` serving a job.

    python engine_driver.py JOB.json RESULT.json

The job names the model, the `sglang.Engine` keyword arguments and batches of token-id prompts (with
optional request ids, ``rid``); each batch
goes to `Engine.generate` as one call (sglang sends a batch of token ids to the scheduler as one message,
so every request of a batch is queued before the scheduler's next pass). The result holds each batch's
outputs (``output_ids`` and ``meta_info``) and, if asked, a few of sglang's own counters after the run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(job_path: str, result_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    import sglang

    engine = sglang.Engine(model_path=job["model_path"], **job["engine"])
    try:
        outputs = []
        for batch in job["batches"]:
            out = engine.generate(
                input_ids=batch["input_ids"], sampling_params=batch["sampling_params"], rid=batch.get("rid")
            )
            outputs.append([{"output_ids": o["output_ids"], "meta_info": o["meta_info"]} for o in out])
        result = {"outputs": outputs}
        if job.get("server_info"):
            info = engine.get_server_info()
            result["server_info"] = {k: info.get(k) for k in ("max_total_num_tokens", "max_running_requests")}
        Path(result_path).write_text(json.dumps(result, default=str))
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
