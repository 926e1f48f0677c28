"""The CPU test engine's extend attention (`harness.cpu_attention`): the same output as sglang's ``torch_native``
extend, computed from each chunk's own queries; how the plugin names the attention an engine runs; and the entry
point that loads it only where the stand-in is on the path."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

from harness.cpu_attention import ENTRY_POINT, ChunkQueryTorchAttnBackend, offset_causal_mask
from harness.cpu_env import STANDIN_DIR, cpu_sglang_env
from scheduler.pass_cost import AttentionWork
from scheduler.sglang_plugin.attach import attention_work

HEAD_DIM = 8


def bare(cls: type) -> TorchNativeAttnBackend:
    """A backend object for its SDPA methods alone (they read no model runner state)."""
    return cls.__new__(cls)


def extend_batch(seed: int, rows: list[tuple[int, int]], q_heads: int, kv_heads: int, dtype: torch.dtype) -> dict:
    """A KV pool holding every request's whole sequence at scattered slots, and the chunks' queries."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(prefix + chunk for prefix, chunk in rows)
    pool_slots = torch.randperm(total + 7, generator=gen)[:total]
    req_to_token = torch.zeros((len(rows) + 2, max(p + c for p, c in rows) + 3), dtype=torch.int64)
    pool_rows = torch.randperm(len(rows) + 2, generator=gen)[: len(rows)]
    used = 0
    for row, (prefix, chunk) in zip(pool_rows.tolist(), rows, strict=True):
        req_to_token[row, : prefix + chunk] = pool_slots[used : used + prefix + chunk]
        used += prefix + chunk
    tokens = sum(chunk for _, chunk in rows)
    return {
        "query": torch.randn((tokens, q_heads, HEAD_DIM), generator=gen).to(dtype),
        "k_cache": torch.randn((total + 7, kv_heads, HEAD_DIM), generator=gen).to(dtype),
        "v_cache": torch.randn((total + 7, kv_heads, HEAD_DIM), generator=gen).to(dtype),
        "req_to_token": req_to_token,
        "req_pool_indices": pool_rows,
        "seq_lens": torch.tensor([p + c for p, c in rows]),
        "extend_prefix_lens": torch.tensor([p for p, _ in rows]),
        "extend_seq_lens": torch.tensor([c for _, c in rows]),
    }


def run_extend(cls: type, batch: dict, window: int | None, gqa: bool) -> torch.Tensor:
    output = torch.full_like(batch["query"], float("nan"))
    bare(cls)._run_sdpa_forward_extend(
        batch["query"], output, batch["k_cache"], batch["v_cache"], batch["req_to_token"],
        batch["req_pool_indices"], batch["seq_lens"], batch["extend_prefix_lens"], batch["extend_seq_lens"],
        scaling=HEAD_DIM**-0.5, enable_gqa=gqa, causal=True, sliding_window_size=window,
    )  # fmt: skip
    return output


rows_strategy = st.lists(st.tuples(st.integers(0, 300), st.integers(1, 70)), min_size=1, max_size=5)


@settings(max_examples=40, deadline=None)
@given(rows=rows_strategy, seed=st.integers(0, 2**16), gqa=st.booleans(), window=st.sampled_from([None, -1, 0, 5, 90]))
def test_chunk_queries_attend_as_torch_native_does(rows, seed, gqa, window):
    # Several requests, each a chunk after its own cached prefix (a one-token chunk is a decode row riding along).
    q_heads, kv_heads = (4, 2) if gqa else (4, 4)
    batch = extend_batch(seed, rows, q_heads, kv_heads, torch.float32)
    ours = run_extend(ChunkQueryTorchAttnBackend, batch, window, gqa)
    theirs = run_extend(TorchNativeAttnBackend, batch, window, gqa)
    assert not ours.isnan().any()
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_a_bf16_batch_matches_within_bf16_rounding():
    rows = [(0, 40), (257, 33), (1000, 1), (64, 64)]
    batch = extend_batch(3, rows, 4, 4, torch.bfloat16)
    ours = run_extend(ChunkQueryTorchAttnBackend, batch, None, False)
    theirs = run_extend(TorchNativeAttnBackend, batch, None, False)
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=2e-2, atol=2e-2)


def test_the_mask_is_causal_from_the_prefix_on():
    mask = offset_causal_mask(3, 2, None, torch.device("cpu"))
    assert mask is not None and mask.tolist() == [[True] * 4 + [False], [True] * 5]
    assert offset_causal_mask(0, 5, None, torch.device("cpu")) is None  # SDPA's own causal flag
    assert offset_causal_mask(9, 1, None, torch.device("cpu")) is None  # one query sees the whole sequence
    windowed = offset_causal_mask(3, 1, 1, torch.device("cpu"))
    assert windowed is not None and windowed.tolist() == [[False, False, True, True]]


def engine_with(backend: object) -> SimpleNamespace:
    return SimpleNamespace(tp_worker=SimpleNamespace(model_runner=SimpleNamespace(attn_backend=backend)))


def test_the_plugin_counts_the_attention_the_engine_runs():
    torch_native, chunk_queries = bare(TorchNativeAttnBackend), bare(ChunkQueryTorchAttnBackend)
    assert attention_work(engine_with(torch_native)) is AttentionWork.PADDED_CAUSAL
    assert attention_work(engine_with(chunk_queries)) is AttentionWork.QUERIES
    hybrid = SimpleNamespace(prefill_backend=torch_native, decode_backend=chunk_queries)
    assert attention_work(engine_with(hybrid)) is AttentionWork.PADDED_CAUSAL  # extends run on the prefill backend
    assert attention_work(engine_with(SimpleNamespace())) is AttentionWork.QUERIES  # FlashInfer, FlashAttention...
    assert attention_work(SimpleNamespace()) is AttentionWork.QUERIES


def test_the_entry_point_is_seen_only_with_the_stand_in_on_the_path(monkeypatch):
    def plugins() -> dict[str, str]:
        return {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}

    assert ENTRY_POINT not in plugins()  # the pytest process, and any installed deployment
    assert str(STANDIN_DIR) in cpu_sglang_env()["PYTHONPATH"].split(":")
    monkeypatch.setattr(sys, "path", [str(STANDIN_DIR), *sys.path])
    assert plugins()[ENTRY_POINT] == "harness.cpu_attention:load"


@pytest.fixture
def attention_registry():
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    saved = dict(ATTENTION_BACKENDS)
    yield ATTENTION_BACKENDS
    ATTENTION_BACKENDS.clear()
    ATTENTION_BACKENDS.update(saved)


def test_loading_the_plugin_makes_torch_native_build_the_chunk_query_backend(attention_registry, monkeypatch):
    from harness import cpu_attention

    monkeypatch.setattr(cpu_attention, "ChunkQueryTorchAttnBackend", lambda runner: ("built", runner))
    cpu_attention.load()
    assert attention_registry["torch_native"]("runner") == ("built", "runner")
