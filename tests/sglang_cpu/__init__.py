"""Tests that run real sglang 0.5.23 on CPU with a tiny random-weight model (marker ``sglang_cpu``).

The infrastructure they use (the `sgl_kernel` stand-in, the environment, the tiny model builder, server and
engine launchers) lives in the `harness` package; the session fixtures here build the tiny models once.
"""
