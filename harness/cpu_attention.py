"""The CPU test engine's extend attention: each chunk's own queries against the cached context and the chunk.

sglang 0.5.23's ``torch_native`` backend, the only attention backend that runs on these CPUs, computes an extend by
padding every request's queries to its whole sequence and running causal SDPA over that square: a 64-token chunk
10,000 tokens into a document costs what the whole 10,000-token prefill costs. GPU backends (FlashAttention,
FlashInfer, triton) compute the chunk's queries against the context, so a chunk costs its own tokens times the
context. The policy is built for the GPU's shape; on the padded one no pass size deep in a document is short.

`ChunkQueryTorchAttnBackend` is sglang's ``torch_native`` backend with that one method replaced: per request, SDPA of
the chunk's queries over its whole sequence's keys with a causal mask offset by the cached prefix (the mask sglang's
own sliding-window helper builds, `_make_sliding_window_mask`). Decode (one query against the context) already has
the GPU's shape and is sglang's own; so is any extend this does not cover (cross-attention, encoder-only layers).

`load` is a general sglang plugin (entry point ``sglang.srt.plugins``) that registers it as ``torch_native`` in
sglang's attention registry. Its entry point is a dist-info directory in `harness/sgl_kernel_standin/`, so only the
sglang processes the harness starts with the stand-in on their path load it; it is test infrastructure and never
ships in the package. Why not sglang's ``intel_amx`` backend with ``sgl_kernel`` attention ops in the stand-in:
sglang selects it only where the host has AMX tiles *and* `sgl_kernel` registers ``convert_weight_packed`` (else it
falls back to ``torch_native``), and that switch also routes every linear layer, norm, rope and activation to
`sgl_kernel` ops (weight packing): a second model implementation to write, on some hosts only.

The plugin (`scheduler.sglang_plugin.attach.attention_work`) reads which extend the engine runs from the backend
object itself, so it counts this backend's attention as the GPU's (``queries``) and sglang's own as padded.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from torch.nn.functional import scaled_dot_product_attention

logger = logging.getLogger("fairshare.cpu_attention")

STARTED_LINE = "torch_native extend attends from each chunk's queries (harness/cpu_attention.py)"
"""Logged by every model runner that builds the backend (a test reads it in the engine's log)."""

ENTRY_POINT = "fairshare_cpu_chunk_attention"
"""The plugin's name in sglang's ``sglang.srt.plugins`` group (what ``SGLANG_PLUGINS`` would name)."""


def offset_causal_mask(
    prefix_tokens: int, chunk_tokens: int, window_tokens: int | None, device: torch.device
) -> torch.Tensor | None:
    """The mask of a chunk's queries (positions ``prefix .. prefix + chunk``) over its sequence's keys: causal, and
    within `window_tokens` behind when there is a window. None where no window and no mask is needed: a one-token
    chunk sees its whole sequence, and a chunk from the start is SDPA's own causal square."""
    if window_tokens is None and (chunk_tokens == 1 or prefix_tokens == 0):
        return None
    return TorchNativeAttnBackend._make_sliding_window_mask(
        q_len=chunk_tokens,
        kv_len=prefix_tokens + chunk_tokens,
        sliding_window_size=window_tokens if window_tokens is not None else prefix_tokens + chunk_tokens,
        device=device,
        query_offset=prefix_tokens,
    )


class ChunkQueryTorchAttnBackend(TorchNativeAttnBackend):
    """sglang's ``torch_native`` backend whose extend attends from each chunk's own queries (the GPU's cost)."""

    def __init__(self, model_runner: Any) -> None:
        super().__init__(model_runner)
        logger.info(STARTED_LINE)

    def _run_sdpa_forward_extend(
        self,
        query: torch.Tensor,
        output: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        req_to_token: torch.Tensor,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        extend_prefix_lens: torch.Tensor,
        extend_seq_lens: torch.Tensor,
        encoder_lens: torch.Tensor | None = None,
        scaling: float | None = None,
        enable_gqa: bool = False,
        causal: bool = False,
        is_cross_attn: bool = False,
        sliding_window_size: int | None = None,
    ) -> torch.Tensor:
        """Arguments and result as sglang's (`TorchNativeAttnBackend._run_sdpa_forward_extend`): query and output
        ``[tokens, heads, head_dim]``, the chunks of the batch's requests one after another."""
        if encoder_lens is not None or is_cross_attn or not causal:
            return super()._run_sdpa_forward_extend(
                query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, extend_prefix_lens,
                extend_seq_lens, encoder_lens, scaling, enable_gqa, causal, is_cross_attn, sliding_window_size,
            )  # fmt: skip
        window = sliding_window_size if sliding_window_size is not None and sliding_window_size > -1 else None
        heads_first = query.movedim(0, 1)  # [heads, tokens, head_dim]
        start = 0
        rows = zip(req_pool_indices.tolist(), extend_prefix_lens.tolist(), extend_seq_lens.tolist(), strict=True)
        for pool_row, prefix, chunk in rows:
            end = start + chunk
            kv_slots = req_to_token[pool_row, : prefix + chunk]
            keys, values = k_cache[kv_slots].movedim(0, 1), v_cache[kv_slots].movedim(0, 1)
            queries = heads_first[:, start:end, :]
            if not queries.dtype == keys.dtype == values.dtype:
                keys, values = keys.to(queries.dtype), values.to(queries.dtype)
            mask = offset_causal_mask(prefix, chunk, window, queries.device)
            out = scaled_dot_product_attention(
                queries.unsqueeze(0),
                keys.unsqueeze(0),
                values.unsqueeze(0),
                attn_mask=mask,
                is_causal=mask is None and prefix == 0 and chunk > 1,
                scale=scaling,
                enable_gqa=enable_gqa,
            )
            output[start:end] = out.squeeze(0).movedim(0, 1)
            start = end
        return output


def create_backend(runner: Any) -> ChunkQueryTorchAttnBackend:
    return ChunkQueryTorchAttnBackend(runner)


def load() -> None:
    """sglang general plugin: ``torch_native`` builds `ChunkQueryTorchAttnBackend` in this process."""
    from sglang.srt.layers.attention.attention_registry import register_attention_backend

    register_attention_backend("torch_native")(create_backend)
