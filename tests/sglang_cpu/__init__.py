"""Real sglang 0.5.23 on CPU, for tests (issue 7): the `sgl_kernel` stand-in, the environment every sglang
process needs, a tiny random-weight model built once per session, and helpers that run
``python -m sglang.launch_server`` or an in-process `sglang.Engine` with hard timeouts and process-group
cleanup. Other test directories reuse them: ``from sglang_cpu.fixtures import tiny_model_dir, ...`` in
their conftest (``tests/`` is on ``sys.path`` under pytest), and mark their tests ``sglang_cpu``.
"""
