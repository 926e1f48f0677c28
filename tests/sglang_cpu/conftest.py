import signal

from tests.sglang_cpu.fixtures import tiny_bytes_model_dir, tiny_model_dir  # noqa: F401  (session fixtures, shared)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    # A CI timeout sends SIGTERM: unwind like Ctrl-C so fixtures stop the sglang process groups they started.
    signal.signal(signal.SIGTERM, _interrupt)
