"""sglang 0.5.23 on CPU: imported once per session, its config namespaces published for a dummy model."""

import logging
import os
import warnings

import pytest

warnings.filterwarnings("ignore", message=".*(Only CUDA|Triton is not supported).*")

from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402

set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", device="cpu"))

from harness import sglang_classes  # noqa: E402


@pytest.fixture(autouse=True)
def _policy_env_and_unpatched_sglang(monkeypatch):
    """Each test starts from the policy's defaults, with sglang's classes as shipped."""
    for name in list(os.environ):
        if name.upper().startswith("FAIRSHARE_"):
            monkeypatch.delenv(name)
    assert sglang_classes.sglang_is_unpatched(), "a test patched sglang's classes in the pytest process"
    logging.getLogger("fairshare").setLevel(logging.NOTSET)
    yield
    assert sglang_classes.sglang_is_unpatched(), "a test patched sglang's classes in the pytest process"
