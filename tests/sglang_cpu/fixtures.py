"""Session-scoped pytest fixtures for real sglang on CPU; import them into a conftest to reuse them."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest

from harness.tiny_model import TinyModelSpec, build_tiny_model
from scheduler.sglang_plugin.loading import TESTED_SGLANG_VERSION

TINY_MODEL = TinyModelSpec()


def check_sglang_version() -> None:
    installed = version("sglang")
    if installed != TESTED_SGLANG_VERSION:
        pytest.fail(
            f"the sgl_kernel stand-in covers sglang {TESTED_SGLANG_VERSION}'s CPU imports; installed: {installed}. "
            "A new release may import more sgl_kernel symbols: re-check tests/sglang_cpu/standin"
        )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight Llama with a local word-level tokenizer (``w0 w1 ...``), built once per session."""
    check_sglang_version()
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), TINY_MODEL)


@pytest.fixture(scope="session")
def tiny_bytes_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with a byte-level BPE tokenizer: grammar-constrained output (JSON, tool calls) is possible."""
    check_sglang_version()
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama-bytes"), TinyModelSpec(byte_level=True))
