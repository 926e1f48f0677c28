"""Test-only stand-in for the few `sgl_kernel` CPU symbols sglang 0.5.23 imports (never shipped).

With ``SGLANG_USE_CPU_ENGINE=1`` sglang imports ``*_cpu`` symbols from `sgl_kernel` at import time, and
there is no CPU build of sgl-kernel on the package index. Only `assign_req_to_token_pool_cpu` runs in a
plain (non-speculative) server; it is a torch loop here. The others are imported but never called
without speculative decoding: they raise `NotImplementedError` naming themselves. Any other name is an
`AttributeError` (an `ImportError` at ``from sgl_kernel import ...``) naming it. No `torch.ops.sgl_kernel`
op is registered, so sglang's AMX detection stays false and every layer uses sglang's own torch code.
"""

from __future__ import annotations

import torch

STANDIN = True
"""Marks this package as the test stand-in (a test checks it never lands in the installed package)."""


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """For each request i, write its next ``end - start`` KV locations (taken from `out_cache_loc` in order)
    into ``req_to_token[req_pool_indices[i], start:end]`` (`sglang/srt/mem_cache/allocation.py`)."""
    pos = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        if not 0 <= start <= end <= pool_len:
            raise ValueError(f"assign_req_to_token_pool_cpu: offsets {start}..{end} outside 0..{pool_len}")
        n = end - start
        req_to_token[row, start:end] = out_cache_loc[pos : pos + n].to(req_to_token.dtype)
        pos += n


def _not_implemented(name: str):
    def missing(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not implemented by the test stand-in (harness/sgl_kernel_standin): "
            "speculative decoding and KV moves need the real sgl-kernel"
        )

    missing.__name__ = name
    return missing


_IMPORTED_NOT_CALLED = (
    "copy_all_layer_kv_cache_cpu",  # kernels/ops/kvcache/cache_move.py
    "assign_draft_cache_locs_contiguous_cpu",  # kernels/ops/speculative/cache_locs.py
    "assign_extend_cache_locs_cpu",
    "fill_accept_out_cache_loc_cpu",  # kernels/ops/speculative/eagle.py
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",  # kernels/ops/speculative/multi_layer_eagle.py
    "build_tree_kernel_efficient_cpu",  # kernels/ops/speculative/spec_tree.py
    "verify_tree_greedy_cpu",
)
globals().update({name: _not_implemented(name) for name in _IMPORTED_NOT_CALLED})


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"sgl_kernel.{name} is not provided by the test stand-in (harness/sgl_kernel_standin); "
        "it covers sglang 0.5.23's CPU imports only"
    )
