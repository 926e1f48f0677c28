"""What timing every pass and fitting the pass-cost model online cost the scheduler loop, per pass.

The plugin's `process_batch_result` hook runs once per forward pass: it reads the pass's figures from the batch
(`pass_timer.launch_figures`: a mixed batch's rows walked, a decode batch's CPU tensor of sequence lengths held and
summed when the pass is timed; `pass_timer.pass_figures`, timed here, does both), and `PassTimer.landed` predicts
the pass, writes it into the fit's window and refits every `FitSettings.refit_every_passes` passes
(`scheduler.pass_cost_fit`). Measured here on stand-in batches with sglang's own forward modes and torch tensors (no
model), as CPU time of the timing thread:

1. the figures of one batch, for decode batches of 8, 64 and 256 rows and a mixed batch (a 2,048-token chunk
   beside 64 decoding rows);
2. `landed` per pass, its refits included, over thousands of passes with the default settings (window 512,
   refit every 64): the amortised per-pass cost, and one refit of a full window alone.

Target: per pass, figures and fit together, within a few microseconds of the plugin's own time per pass
(`benchmarks/policy_decision_time.py`), which is itself a fraction of a percent of a pass.

    python -m benchmarks.pass_cost_fit_time [--quick]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import warnings
from collections.abc import Callable
from types import SimpleNamespace

from harness.results import records
from scheduler.pass_cost import chunk_ctx_pairs
from scheduler.pass_cost_fit import LinearPassCost, OnlinePassCost

ENGINE = LinearPassCost(
    fixed_s=0.008, prefill_token_s=2.5e-5, prefill_pair_s=2e-9, decode_row_s=1e-4, decode_ctx_token_s=4e-8
)
"""A GPU-like engine the timed passes follow (its figures do not change the cost of fitting them)."""


def cpu_us(fn: Callable[[], object], loops: int, repeats: int) -> list[float]:
    """CPU microseconds per call of `fn`, one figure per timed loop."""
    out = []
    for _ in range(repeats):
        started = time.thread_time_ns()
        for _ in range(loops):
            fn()
        out.append((time.thread_time_ns() - started) / loops / 1e3)
    return out


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):8.2f} ({min(values):.2f}-{max(values):.2f})"


def stand_in_batches() -> dict[str, SimpleNamespace]:
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    rng = random.Random(0)

    def batch(mode, prefix_lens=(), extend_lens=(), seq_lens=None):
        n = len(seq_lens) if seq_lens is not None else len(extend_lens)
        return SimpleNamespace(
            forward_mode=mode,
            spec_algorithm=SpeculativeAlgorithm.NONE,
            dllm_config=None,
            prefix_lens=list(prefix_lens),
            extend_lens=list(extend_lens),
            seq_lens_cpu=None if seq_lens is None else torch.tensor(seq_lens, dtype=torch.int64),
            reqs=[object()] * n,
        )

    batches = {
        f"decode x{rows}": batch(ForwardMode.DECODE, seq_lens=[rng.randrange(100, 30_000) for _ in range(rows)])
        for rows in (8, 64, 256)
    }
    prefixes = [12_000] + [rng.randrange(100, 30_000) for _ in range(64)]
    batches["mixed 2048 + x64"] = batch(ForwardMode.MIXED, prefix_lens=prefixes, extend_lens=[2048] + [1] * 64)
    return batches


def timed_passes(n: int, seed: int) -> list[tuple[tuple[int, float, int, int], float]]:
    """`n` passes as an engine runs them, each with its measured seconds (the engine's, 3% noise)."""
    rng = random.Random(seed)
    passes = []
    for _ in range(n):
        tokens = rng.choice([0, 0, 256, 2048])
        rows = rng.randrange(0 if tokens else 1, 64)
        figures = (tokens, chunk_ctx_pairs(rng.randrange(0, 30_000), tokens), rows, rows * rng.randrange(100, 20_000))
        passes.append((figures, ENGINE.pass_s(*figures) * (1 + rng.gauss(0, 0.03))))
    return passes


def landed_us(passes: list[tuple[tuple[int, float, int, int], float]], repeats: int) -> tuple[list[float], int]:
    """CPU microseconds per `PassTimer.landed` call, refits included; and how many refits each loop ran."""
    from scheduler.sglang_plugin.pass_timer import PassFigures, PassTimer

    figures = [PassFigures(*f) for f, _ in passes]
    out, fits = [], 0
    for _ in range(repeats):
        timer = PassTimer(OnlinePassCost())
        now = 0.0
        started = time.thread_time_ns()
        for i, (f, (_, seconds)) in enumerate(zip(figures, passes, strict=True)):
            timer.landed(now, f, now + seconds, i)
            now += seconds
        out.append((time.thread_time_ns() - started) / len(passes) / 1e3)
        fits = timer.fit.num_fits
    return out, fits


def refit_us(passes: list[tuple[tuple[int, float, int, int], float]], repeats: int) -> list[float]:
    fit = OnlinePassCost()
    for figures, seconds in passes:
        fit.observe(*figures, seconds)
    return cpu_us(fit.refit, 20, repeats)


@records("pass-cost-fit-time", "Per-pass cost of timing every pass and fitting the pass-cost model online")
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed loops (CI scale)")
    args = parser.parse_args()
    repeats = 5 if args.quick else 9
    warnings.filterwarnings("ignore")
    from scheduler.sglang_plugin.pass_timer import pass_figures

    print(f"machine load (1-min average): {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("\n1. The figures of one batch (pass_figures); CPU us per batch: median (min-max of loops)")
    for name, batch in stand_in_batches().items():
        print(f"{name:>18}: {fmt(cpu_us(lambda b=batch: pass_figures(b), 2_000, repeats))}")

    n = 2_048 if args.quick else 8_192
    passes = timed_passes(n, seed=1)
    per_pass, fits = landed_us(passes, repeats)
    print(f"\n2. PassTimer.landed over {n} passes ({fits} refits a loop); CPU us per pass, refits included")
    print(f"{'landed':>18}: {fmt(per_pass)}")
    print(f"{'one refit (512)':>18}: {fmt(refit_us(passes, repeats))}")


if __name__ == "__main__":
    main()
