import signal

from sglang_cpu.fixtures import tiny_model_dir  # noqa: F401  (a session fixture, shared with other dirs)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    # A CI timeout sends SIGTERM: unwind like Ctrl-C so fixtures stop the sglang process groups they started.
    signal.signal(signal.SIGTERM, _interrupt)
