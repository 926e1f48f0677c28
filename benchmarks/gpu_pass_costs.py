"""What a forward pass of an 8B dense model costs on a GPU, measured and fitted, against the `h100-8b` preset.

The simulator prices a pass with `CostModel` (`scheduler/sim/cost_model.py`): a fixed cost per pass, a rate of
prefill tokens through the linear layers, a cost per decoding row and a cost per attention (token, context token)
pair, summed (``overlap_p = 1``). The `h100-8b` preset's four figures were written from FLOP estimates, not
measured. This benchmark tests that assumption: it times forward passes of a Llama-3-8B-shaped decoder (32 layers,
4096 wide, 32 query and 8 KV heads of 128, SwiGLU MLP 14336, vocabulary 128256, RMSNorm; random bf16 weights) in
plain PyTorch over a grid of pass shapes, fits the same four figures to the times (non-negative least squares
of the relative error), and compares both with the preset. It fits apart the five figures of the plugin's online
fit too (`scheduler.pass_cost_fit.LinearPassCost`), whose decode context tokens (KV reads) cost apart from
prefill attention pairs (multiplies), where CostModel has one figure for both. The passes:

- prefill passes of T tokens (64 to 8,192) over C cached tokens (0, 8,192, 32,768): one sequence's chunk attends
  to its C cached tokens and causally to itself;
- decode passes of B rows (1 to 128), each one new token over a context of C tokens (2,048, 8,192).

What it is not: sglang's engine. Passes run eagerly, without CUDA graphs (sglang graphs its decode passes, so the
eager launch overhead, hundreds of kernels a pass, overstates decode's fixed cost), with PyTorch's SDPA kernels
instead of FlashInfer or FA3, without rotary embeddings (elementwise, a small share of a pass), and with one
layer's KV buffer shared by every layer (the timing matters here, not the numbers). An H200 multiplies bf16 like
an H100 but reads memory 1.4x as fast, so what reading weights and KV costs (decode, the fixed cost) comes out
below an H100's.

Two steps, since the GPU machine has torch but not this project's dependencies:

    python3 -m benchmarks.gpu_pass_costs --out pass_costs.json      # on the GPU: measures, needs torch alone
    python -m benchmarks.gpu_pass_costs --fit-only pass_costs.json  # with the project: fit, table, result file

``--tiny`` runs a 2-layer, 256-wide model over a small grid: seconds on a CPU (``--device cpu``), for tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

# torch is imported where it is used, and the project (pydantic) only in the fit step: measuring needs torch alone
# (the GPU machine), fitting needs the project alone.

NAME = "gpu-pass-costs"
TITLE = "Forward-pass costs of an 8B dense model on a GPU, fitted, against the h100-8b preset"


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int


LLAMA3_8B = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, mlp=14336, vocab=128256)
TINY_MODEL = ModelShape(layers=2, hidden=256, heads=4, kv_heads=1, head_dim=64, mlp=896, vocab=1024)
"""Small enough for a CPU, with the 8B model's 4 query heads per KV head."""


@dataclass(frozen=True)
class Grid:
    prefill_tokens: tuple[int, ...]
    prefill_ctx: tuple[int, ...]
    decode_rows: tuple[int, ...]
    decode_ctx: tuple[int, ...]


FULL_GRID = Grid(
    prefill_tokens=(64, 128, 256, 512, 1024, 2048, 4096, 8192),
    prefill_ctx=(0, 8192, 32768),
    decode_rows=(1, 8, 32, 64, 128),
    decode_ctx=(2048, 8192),
)
TINY_GRID = Grid(prefill_tokens=(16, 64, 256), prefill_ctx=(0, 512), decode_rows=(1, 8), decode_ctx=(256,))


@dataclass(frozen=True)
class PassShape:
    kind: str
    """"prefill" (`size` tokens of one sequence over `ctx` cached ones) or "decode" (`size` rows of `ctx` each)."""
    size: int
    ctx: int

    def label(self) -> str:
        return f"{self.kind} {'T' if self.kind == 'prefill' else 'B'}={self.size} C={self.ctx}"

    def figures(self) -> dict[str, float]:
        """`CostModel.pass_s`'s arguments for this pass. The pairs are `scheduler.pass_cost.chunk_ctx_pairs`, written
        out: importing it needs pydantic, which the GPU machine lacks."""
        if self.kind == "prefill":
            pairs = self.size * self.ctx + self.size * (self.size + 1) / 2
            return {"prefill_tokens": self.size, "prefill_ctx_pairs": pairs, "decode_rows": 0, "decode_ctx_tokens": 0}
        rows, ctx_tokens = self.size, self.size * self.ctx
        return {"prefill_tokens": 0, "prefill_ctx_pairs": 0.0, "decode_rows": rows, "decode_ctx_tokens": ctx_tokens}


def pass_shapes(grid: Grid) -> list[PassShape]:
    """Cheapest first, so a run stopped by its time budget still holds every small pass."""
    decode = [PassShape("decode", b, c) for c in grid.decode_ctx for b in grid.decode_rows]
    prefill = [PassShape("prefill", t, c) for c in grid.prefill_ctx for t in grid.prefill_tokens]
    return decode + prefill


# ---- The fit (numpy and scipy: no torch, no project) ----

FIGURES = ("prefill_tokens", "prefill_ctx_pairs", "decode_rows", "decode_ctx_tokens")


SPLIT_FIGURES = ("fixed_s", "prefill_token_s", "prefill_pair_s", "decode_row_s", "decode_ctx_token_s")
"""`scheduler.pass_cost_fit.LinearPassCost`'s figures: the online fit's model, whose prefill pairs and decode
context tokens cost apart (prefill attention multiplies, decode attention reads the KV cache)."""


def design_row(sample: Mapping[str, float]) -> list[float]:
    """`CostModel.pass_s` with p = 1 is linear in (fixed_s, 1 / prefill_tok_per_s, decode_row_s,
    attn_s_per_token_ctx): this pass's multiplier of each."""
    pairs = sample["prefill_ctx_pairs"] + sample["decode_ctx_tokens"]
    return [1.0, float(sample["prefill_tokens"]), float(sample["decode_rows"]), float(pairs)]


def split_design_row(sample: Mapping[str, float]) -> list[float]:
    """This pass's multiplier of each of `SPLIT_FIGURES`: one, then its `FIGURES` in order."""
    return [1.0, *(float(sample[name]) for name in FIGURES)]


def nnls_relative(rows: list[list[float]], measured_s: list[float]) -> tuple[list[float], dict[str, float]]:
    """Non-negative least squares of the relative error, and how well it fits. Relative: the passes span
    milliseconds to a second, and in absolute terms the long ones would decide alone, while the fixed cost shows
    in the short ones."""
    from scipy.optimize import nnls

    a, y = np.array(rows, dtype=float), np.array(measured_s, dtype=float)
    if len(y) < a.shape[1]:
        raise ValueError(f"{a.shape[1]} figures need at least as many passes, got {len(y)}")
    weighted = a / y[:, None]
    # The columns differ by up to 1e9 (one per pass against attention pairs): scaled alike, nnls's tolerance means
    # the same for each.
    scale = np.abs(weighted).max(axis=0)
    scale[scale == 0] = 1.0
    coef = nnls(weighted / scale, np.ones_like(y))[0] / scale
    rel = a @ coef / y - 1.0
    quality = {"rms_rel_err": float(np.sqrt(np.mean(rel**2))), "max_rel_err": float(np.max(np.abs(rel)))}
    return [float(c) for c in coef], {**quality, "passes": len(y)}


def fit_cost(samples: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """CostModel's four figures (p = 1, none negative) fitted to passes with their `FIGURES` and ``median_s``."""
    coef, quality = nnls_relative([design_row(s) for s in samples], [s["median_s"] for s in samples])
    fixed_s, token_s, row_s, pair_s = coef
    return {
        "fixed_s": fixed_s,
        "prefill_tok_per_s": 1.0 / token_s if token_s > 0 else math.inf,
        "decode_row_s": row_s,
        "attn_s_per_token_ctx": pair_s,
        "overlap_p": 1.0,
        **quality,
    }


def fit_split_cost(samples: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """`SPLIT_FIGURES` fitted as `fit_cost` fits CostModel's."""
    coef, quality = nnls_relative([split_design_row(s) for s in samples], [s["median_s"] for s in samples])
    return {**dict(zip(SPLIT_FIGURES, coef, strict=True)), **quality}


# ---- The model (torch) ----


@dataclass
class Layer:
    norm1: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    norm2: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@dataclass
class Model:
    shape: ModelShape
    embed: torch.Tensor
    layers: list[Layer]
    norm: torch.Tensor
    lm_head: torch.Tensor


Attend = Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor"], "torch.Tensor"]
"""A pass's attention: the new tokens' q, k, v (rows × heads·dim) to their output (rows × heads·dim)."""


def random_model(s: ModelShape, device: torch.device, seed: int = 0) -> Model:
    """Separate weights per layer: a decode pass reads all 16 GB of them, and that read is much of its cost."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)

    def w(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device, dtype=torch.bfloat16).mul_(0.02)

    def ones() -> torch.Tensor:
        return torch.ones(s.hidden, device=device, dtype=torch.bfloat16)

    qkv_out = (s.heads + 2 * s.kv_heads) * s.head_dim
    layers = [
        Layer(
            ones(),
            w(qkv_out, s.hidden),
            w(s.hidden, s.heads * s.head_dim),
            ones(),
            w(2 * s.mlp, s.hidden),
            w(s.hidden, s.mlp),
        )
        for _ in range(s.layers)
    ]
    return Model(s, w(s.vocab, s.hidden), layers, ones(), w(s.vocab, s.hidden))


def block(s: ModelShape, layer: Layer, x: torch.Tensor, attend: Attend) -> torch.Tensor:
    import torch.nn.functional as F

    h = F.rms_norm(x, (s.hidden,), layer.norm1)
    qkv, q_end = F.linear(h, layer.qkv), s.heads * s.head_dim
    k_end = q_end + s.kv_heads * s.head_dim
    q, k, v = qkv[:, :q_end], qkv[:, q_end:k_end], qkv[:, k_end:]
    x = x + F.linear(attend(q, k, v), layer.o)
    h = F.rms_norm(x, (s.hidden,), layer.norm2)
    gate, up = F.linear(h, layer.gate_up).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, layer.down)


def forward(model: Model, ids: torch.Tensor, attend: Attend, last_only: bool) -> torch.Tensor:
    import torch.nn.functional as F

    x = F.embedding(ids, model.embed)
    for layer in model.layers:
        x = block(model.shape, layer, x, attend)
    if last_only:  # a prefill pass computes logits for the chunk's last token alone, as engines do
        x = x[-1:]
    return F.linear(F.rms_norm(x, (model.shape.hidden,), model.norm), model.lm_head)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, expand_kv: bool) -> torch.Tensor:
    """q (1, heads, T, dim) over k, v (1, kv_heads, C + T, dim): each new token sees the C cached ones and the new
    ones up to itself.

    The mask is PyTorch's lower-right causal bias: SDPA runs it in its flash kernel (no mask tensor, GQA native),
    the simplest of the correct ones. An explicit boolean mask would push SDPA off flash, and splitting into
    context and self attention merged by log-sum-exp needs the kernels' private LSE outputs. `expand_kv` repeats
    the KV heads instead of asking for GQA: the fallback for a torch whose lower-right path lacks GQA (it costs
    copies, so `check_attention` takes it only when it must)."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    t, total = q.shape[2], k.shape[2]
    if expand_kv:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if t == total:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=not expand_kv)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(t, total), enable_gqa=not expand_kv)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q (rows, heads, dim) over k, v (rows, kv_heads, C, dim), no mask. Each KV head's group of query heads is
    attended as a block of queries over the same keys: exact, any kernel, and what GQA decode kernels do."""
    import torch.nn.functional as F

    rows, heads, dim = q.shape
    kv_heads = k.shape[1]
    return F.scaled_dot_product_attention(q.view(rows, kv_heads, heads // kv_heads, dim), k, v).reshape(rows, -1)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Lower-right causal attention in float32 with an explicit mask and repeated KV heads: what the fast paths
    must match."""
    import torch
    import torch.nn.functional as F

    t, total, group = q.shape[2], k.shape[2], q.shape[1] // k.shape[1]
    mask = torch.ones(t, total, dtype=torch.bool, device=q.device).tril(total - t)
    k, v = (x.float().repeat_interleave(group, dim=1) for x in (k, v))
    return F.scaled_dot_product_attention(q.float(), k, v, attn_mask=mask)


def prefill_attend(s: ModelShape, k_buf: torch.Tensor, v_buf: torch.Tensor, ctx: int, expand_kv: bool) -> Attend:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t = q.shape[0]
        k_buf[0, :, ctx:] = k.view(t, s.kv_heads, s.head_dim).transpose(0, 1)
        v_buf[0, :, ctx:] = v.view(t, s.kv_heads, s.head_dim).transpose(0, 1)
        out = causal_attention(q.view(1, t, s.heads, s.head_dim).transpose(1, 2), k_buf, v_buf, expand_kv)
        return out.transpose(1, 2).reshape(t, s.heads * s.head_dim)

    return attend


def decode_attend(s: ModelShape, k_buf: torch.Tensor, v_buf: torch.Tensor) -> Attend:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rows = q.shape[0]
        k_buf[:, :, -1] = k.view(rows, s.kv_heads, s.head_dim)  # the new token takes its context's last slot
        v_buf[:, :, -1] = v.view(rows, s.kv_heads, s.head_dim)
        return decode_attention(q.view(rows, s.heads, s.head_dim), k_buf, v_buf)

    return attend


def make_pass(model: Model, shape: PassShape, device: torch.device, expand_kv: bool) -> Callable[[], object]:
    """One pass of `shape`, ready to run. One layer's KV buffer serves every layer (timing, not correctness,
    matters): 128 rows of 8,192 tokens take 4.3 GB a layer, 137 GB for 32."""
    import torch

    s = model.shape
    rows, length = (1, shape.ctx + shape.size) if shape.kind == "prefill" else (shape.size, shape.ctx)
    k_buf, v_buf = (
        torch.randn(rows, s.kv_heads, length, s.head_dim, device=device, dtype=torch.bfloat16) for _ in range(2)
    )
    ids = torch.randint(s.vocab, (shape.size,), device=device)
    if shape.kind == "prefill":
        attend = prefill_attend(s, k_buf, v_buf, shape.ctx, expand_kv)
        return lambda: forward(model, ids, attend, last_only=True)
    attend = decode_attend(s, k_buf, v_buf)
    return lambda: forward(model, ids, attend, last_only=False)


# ---- Timing (torch) ----


def timed_s(run: Callable[[], object], device: torch.device) -> float:
    """One run's seconds. On CUDA, between events on the stream: an eager pass whose launches outpace its kernels
    leaves the GPU waiting on the CPU, and that wait counts, as it does in an eager engine."""
    import torch

    if device.type != "cuda":
        started = time.perf_counter()
        run()
        return time.perf_counter() - started
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    run()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / 1e3


def time_pass(run: Callable[[], object], device: torch.device, warmups: int, repeats: int) -> list[float]:
    import torch

    for _ in range(warmups):
        run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return [timed_s(run, device) for _ in range(repeats)]


def flash_usable(q: torch.Tensor, k: torch.Tensor, gqa: bool) -> bool | None:
    """Whether SDPA's flash kernel takes these inputs (None where torch cannot say): the lower-right causal path
    otherwise falls back to a materialised mask, slow and, at 32k of context, out of memory."""
    try:
        from torch.backends.cuda import SDPAParams, can_use_flash_attention

        return bool(can_use_flash_attention(SDPAParams(q, k, k, None, 0.0, False, gqa), False))
    except Exception:  # an older SDPAParams signature: unknown, not an error
        return None


def fused_attention_only(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """On CUDA, SDPA may run only its fused kernels: a path that would fall back to a materialised mask and the
    math kernel (slow, and out of memory at 32k of context) raises instead, and `check_attention` rejects it."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])


def prefill_path_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, expand_kv: bool) -> float | None:
    """The path's largest difference from `reference_attention`, over a chunk with cached context and one without
    (the two SDPA calls it makes); None where it fails to run on fused kernels."""
    errors = []
    for context in (k.shape[2] - q.shape[2], 0):
        want = reference_attention(q, k[:, :, context:], v[:, :, context:])
        try:
            with fused_attention_only(q.device):
                got = causal_attention(q, k[:, :, context:], v[:, :, context:], expand_kv)
        except (TypeError, RuntimeError) as e:
            print(f"prefill attention (expand_kv={expand_kv}, context {context}) failed: {e}", flush=True)
            return None
        errors.append((got.float() - want).abs().max().item())
    return max(errors)


def check_attention(s: ModelShape, device: torch.device) -> dict[str, Any]:
    """Both attention paths against `reference_attention` on small inputs of the model's head layout, on the
    device. Prefill takes the GQA path if it is correct on fused kernels, else repeated KV heads."""
    import torch

    gen = torch.Generator(device=device).manual_seed(1)

    def rand(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device, dtype=torch.bfloat16)

    q, k, v = rand(1, s.heads, 37, s.head_dim), rand(1, s.kv_heads, 91, s.head_dim), rand(1, s.kv_heads, 91, s.head_dim)
    result: dict[str, Any] = {}
    for expand_kv in (False, True):
        err = prefill_path_error(q, k, v, expand_kv)
        flash = flash_usable(q, k.repeat_interleave(s.heads // s.kv_heads, 1) if expand_kv else k, not expand_kv)
        print(f"prefill attention (expand_kv={expand_kv}): max error {err}, flash kernel {flash}", flush=True)
        if err is not None and err < 3e-2:
            result = {"prefill_expand_kv": expand_kv, "prefill_flash": flash, "prefill_check_max_err": err}
            break
    if not result:
        raise SystemExit("no prefill attention path matched the reference on fused kernels: see above")
    q, k, v = rand(3, s.heads, s.head_dim), rand(3, s.kv_heads, 50, s.head_dim), rand(3, s.kv_heads, 50, s.head_dim)
    want = reference_attention(q.unsqueeze(2), k, v).squeeze(2).reshape(3, -1)
    with fused_attention_only(device):
        result["decode_check_max_err"] = (decode_attention(q, k, v).float() - want).abs().max().item()
    if result["decode_check_max_err"] >= 3e-2:
        raise SystemExit(f"decode attention differs from the reference: {result['decode_check_max_err']:.2e}")
    return result


def run_info(device: torch.device, model: ModelShape, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {
        "benchmark": NAME,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python": platform.python_version(),
        "device": str(device),
        "device_name": name,
        "dtype": "bfloat16",
        "model": asdict(model),
        "tiny": args.tiny,
        "repeats": args.repeats,
        "warmups": args.warmups,
        "eager": True,
        "cuda_graphs": False,
        "timer": "cuda events" if device.type == "cuda" else "perf_counter",
    }


def measure_one(
    model: Model, shape: PassShape, device: torch.device, args: argparse.Namespace, expand_kv: bool
) -> dict[str, Any]:
    import torch

    row: dict[str, Any] = {"kind": shape.kind, "size": shape.size, "ctx": shape.ctx, **shape.figures()}
    try:
        times = time_pass(make_pass(model, shape, device, expand_kv), device, args.warmups, args.repeats)
    except torch.cuda.OutOfMemoryError as e:  # one shape too big: the others are still worth the loan
        return {**row, "error": f"out of memory: {e}".splitlines()[0]}
    return {**row, "median_s": statistics.median(times), "times_s": times}


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Whole or not at all: a run stopped midway leaves the passes measured so far."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1) + "\n")
    partial.replace(path)


def measure_all(args: argparse.Namespace) -> int:
    import torch

    device = torch.device(args.device)
    started = time.monotonic()
    shape = TINY_MODEL if args.tiny else LLAMA3_8B
    shapes = pass_shapes(TINY_GRID if args.tiny else FULL_GRID)
    data: dict[str, Any] = {**run_info(device, shape, args), "measurements": [], "skipped": []}
    with torch.inference_mode():
        data.update(check_attention(shape, device))
    with torch.inference_mode(), fused_attention_only(device):
        model = random_model(shape, device)
        print(f"{data['device_name']}, torch {data['torch_version']}: {len(shapes)} passes", flush=True)
        for i, pass_shape in enumerate(shapes, 1):
            if time.monotonic() - started > args.max_s:
                data["skipped"].append(pass_shape.label())
                continue
            row = measure_one(model, pass_shape, device, args, data["prefill_expand_kv"])
            data["measurements"].append(row)
            took = f"{row['median_s'] * 1e3:9.2f} ms" if "median_s" in row else row["error"]
            print(
                f"[{i}/{len(shapes)}] {pass_shape.label():<26} {took}  ({time.monotonic() - started:.0f} s)", flush=True
            )
            data["wall_s"] = time.monotonic() - started
            write_json(args.out, data)
    if device.type == "cuda":
        data["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    data["wall_s"] = time.monotonic() - started
    write_json(args.out, data)
    skipped = f", {len(data['skipped'])} skipped past --max-s" if data["skipped"] else ""
    print(f"wrote {args.out} in {data['wall_s']:.0f} s{skipped}; fit it with the project installed:", flush=True)
    print(f"    python -m benchmarks.gpu_pass_costs --fit-only {args.out}", flush=True)
    return 0


# ---- The report (the project: pydantic) ----


TABLE_HEADER = (
    f"{'pass':<26} {'measured ms':>12} {'fitted ms':>10} {'fit err':>8} {'split err':>10} {'h100-8b ms':>11} "
    f"{'preset/meas':>12}"
)
PRESET_FIGURES = ("fixed_s", "prefill_tok_per_s", "decode_row_s", "attn_s_per_token_ctx", "overlap_p")


def report_rows(
    measured: Sequence[Mapping[str, Any]], fit: Mapping[str, float], split: Mapping[str, float]
) -> list[dict[str, Any]]:
    """Each pass measured, and as the fitted models and the preset predict it (their own `pass_s`)."""
    from scheduler.pass_cost_fit import LinearPassCost
    from scheduler.sim.cost_model import CostModel
    from scheduler.sim.presets import H100_8B

    fitted = CostModel(name="fitted", kv_pool_tokens=1, **{k: fit[k] for k in PRESET_FIGURES})
    fitted_split = LinearPassCost(**{k: split[k] for k in SPLIT_FIGURES})
    models = {"fitted_ms": fitted, "split_fitted_ms": fitted_split, "preset_ms": H100_8B.cost}
    return [
        {
            "pass": PassShape(m["kind"], m["size"], m["ctx"]).label(),
            "measured_ms": m["median_s"] * 1e3,
            **{key: model.pass_s(**{k: m[k] for k in FIGURES}) * 1e3 for key, model in models.items()},
        }
        for m in measured
    ]


def print_report(data: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], fits: Mapping[str, Any]) -> None:
    from scheduler.sim.presets import H100_8B

    fit, split = fits["fit"], fits["fit_split"]
    print(f"{data['device_name']} ({data['device']}), torch {data['torch_version']}, CUDA build {data['cuda_version']}")
    print(f"model {data['model']}; eager, no CUDA graphs; median of {data['repeats']} after {data['warmups']} warm-ups")
    if data.get("skipped"):
        print(f"not measured (time budget): {', '.join(data['skipped'])}")
    print("\n" + TABLE_HEADER)
    for r in rows:
        err, split_err = r["fitted_ms"] / r["measured_ms"] - 1, r["split_fitted_ms"] / r["measured_ms"] - 1
        print(
            f"{r['pass']:<26} {r['measured_ms']:12.2f} {r['fitted_ms']:10.2f} {err:+8.1%} {split_err:+10.1%} "
            f"{r['preset_ms']:11.2f} {r['preset_ms'] / r['measured_ms']:12.2f}"
        )
    print(f"\n{'CostModel (p = 1)':<22} {'fitted':>12} {'h100-8b':>12}")
    for name in PRESET_FIGURES:
        print(f"{name:<22} {fit[name]:12.4g} {getattr(H100_8B.cost, name):12.4g}")
    print(f"relative error over {fit['passes']} passes: rms {fit['rms_rel_err']:.1%}, max {fit['max_rel_err']:.1%}")
    print("\nsplit attention (LinearPassCost's figures: prefill pairs and decode context tokens apart)")
    for name in SPLIT_FIGURES:
        print(f"{name:<22} {split[name]:12.4g}")
    print(f"relative error: rms {split['rms_rel_err']:.1%}, max {split['max_rel_err']:.1%}")


def report(path: Path, out: Path | None, argv: list[str] | None) -> int:
    from harness.results import recording
    from scheduler.sim.presets import H100_8B

    data = json.loads(path.read_text())
    measured = [m for m in data["measurements"] if "median_s" in m]
    fits = {"fit": fit_cost(measured), "fit_split": fit_split_cost(measured)}
    rows = report_rows(measured, fits["fit"], fits["fit_split"])
    with recording(NAME, TITLE, argv=None if argv is None else [__file__, *argv]):
        print_report(data, rows, fits)
    if out is not None:
        preset = {"name": H100_8B.name, **H100_8B.cost.model_dump(include=set(PRESET_FIGURES))}
        write_json(out, {**data, **fits, "preset": preset, "rows": rows})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="torch device to measure on (default cuda)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer, 256-wide model over a small grid (tests)")
    parser.add_argument("--out", type=Path, help="JSON to write: the measurements (with --fit-only: and the fit)")
    parser.add_argument("--repeats", type=int, default=10, help="timed passes per shape, median kept (default 10)")
    parser.add_argument("--warmups", type=int, default=3, help="untimed passes per shape first (default 3)")
    parser.add_argument(
        "--max-s", type=float, default=150.0, help="start no new shape after this many seconds (default 150)"
    )
    parser.add_argument("--fit-only", type=Path, metavar="JSON", help="fit and report a measurements JSON")
    args = parser.parse_args(argv)
    if args.fit_only is not None:
        return report(args.fit_only, args.out, argv)
    if args.out is None:
        parser.error("--out is required when measuring")
    if args.repeats < 1 or args.warmups < 0:
        parser.error("--repeats must be at least 1 and --warmups at least 0")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            parser.error("no CUDA device: measure on a GPU machine, or pass --device cpu (with --tiny)")
    return measure_all(args)


if __name__ == "__main__":
    sys.exit(main())
