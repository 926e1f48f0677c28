"""Session-wide test setup: benchmark result files go to a temporary folder; the test process ends without
Python's interpreter finalization, keeping pytest's own exit status.

Every test has run and every report is written by then; what is left is finalization, where a daemon thread that
Ray or sglang left behind can run on freed interpreter state and crash the process (seen once in CI-like runs:
582 passed, then a segmentation fault at exit and `make test` failed). Skipping finalization changes no result.
"""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

from harness.results import RESULTS_DIR_ENV
from tests import hypothesis_budget  # noqa: F401  (registers the fast tier's hypothesis profile)

_exit_status = 0


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _exit_status
    _exit_status = int(exitstatus)


def pytest_configure(config: pytest.Config) -> None:
    # A benchmark a test runs (or a process it starts) writes its result file to a temporary folder, never into
    # docs/results.
    os.environ[RESULTS_DIR_ENV] = tempfile.mkdtemp(prefix="fairshare-test-results-")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status)
