"""The environment every sglang process of a CPU test runs with.

``SGLANG_USE_CPU_ENGINE=1`` must be set before sglang is imported (the spawned scheduler and detokenizer
inherit it), and the `sgl_kernel` stand-in must be importable in every process: it goes on
``PYTHONPATH`` of the processes the tests start, never into the installed package or the pytest process.
Inherited ``FAIRSHARE_*`` variables are dropped, so a test states every switch it relies on.
"""

from __future__ import annotations

import os
from pathlib import Path

STANDIN_DIR = Path(__file__).resolve().parent / "sgl_kernel_standin"
REPO_ROOT = Path(__file__).resolve().parents[1]

CPU_SERVER_ARGS = ["--device", "cpu", "--attention-backend", "torch_native", "--sleep-on-idle"]
"""What every CPU server needs (sleep-on-idle: an idle scheduler otherwise busy-polls a core)."""

CPU_ENGINE_KWARGS = {"device": "cpu", "attention_backend": "torch_native", "sleep_on_idle": True}


def cpu_sglang_env(**fairshare: object) -> dict[str, str]:
    """This process's environment for a CPU sglang child, with ``FAIRSHARE_<KEY>=value`` for each keyword."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("FAIRSHARE_")}
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    path = [str(STANDIN_DIR), str(REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    env.setdefault("OMP_NUM_THREADS", "1")  # two cores shared by the whole test run
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    for key, value in fairshare.items():
        env[f"FAIRSHARE_{key.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return env
