from sglang_cpu.fixtures import tiny_bytes_model_dir, tiny_model_dir  # noqa: F401  (a session fixture, shared with other dirs)
