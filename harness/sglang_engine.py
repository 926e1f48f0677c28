"""An in-process `sglang.Engine`, run in a child process group with a hard timeout (`engine_driver.py`).

The engine lives in a child, not in pytest's process: sglang must be imported with the CPU switch and the
stand-in, and an engine driven from the wrong event loop can hang ignoring SIGTERM; a child process group
is always killable.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from harness.cpu_env import CPU_ENGINE_KWARGS

DRIVER = Path(__file__).resolve().parent / "sglang_engine_driver.py"


class EngineRunError(RuntimeError):
    pass


def run_engine(
    model_path: Path,
    batches: list[dict],
    env: dict[str, str],
    work_dir: Path,
    engine_kwargs: dict | None = None,
    server_info: bool = False,
    timeout_s: float = 900,
    pass_trace: Path | None = None,
) -> dict:
    """Run `batches` (each ``{"input_ids": [[...]], "sampling_params": [{...}]}``, optionally with ``rid``, and
    ``group`` / ``after_passes`` for batches that arrive while a group runs: `sglang_engine_driver`) through a fresh
    engine. `pass_trace`: the trace file the engine writes, which staggered batches are timed by.
    Returns ``{"outputs": [[{"output_ids", "meta_info"}, ...] per batch], "sent_idle": [bool per batch],
    "server_info": {...}}``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    job_path, result_path, log_path = work_dir / "job.json", work_dir / "result.json", work_dir / "engine.log"
    job = {
        "model_path": str(model_path),
        "engine": {**CPU_ENGINE_KWARGS, "log_level": "info", **(engine_kwargs or {})},
        "batches": batches,
        "server_info": server_info,
        "pass_trace": None if pass_trace is None else str(pass_trace),
    }
    job_path.write_text(json.dumps(job))
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(DRIVER), str(job_path), str(result_path)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise EngineRunError(f"engine job timed out after {timeout_s:.0f} s; log tail:\n{log_tail(log_path)}") from e
    finally:
        kill_group(proc)
    if rc != 0 or not result_path.exists():
        raise EngineRunError(f"engine job exited with {rc}; log tail:\n{log_tail(log_path)}")
    return json.loads(result_path.read_text())


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL what is left of the child's process group (the engine's scheduler and detokenizer)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.wait(timeout=30)


def log_tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""
