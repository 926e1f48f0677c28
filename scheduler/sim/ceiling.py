"""The most document throughput a run can reach while it serves the chats it serves: a bound from running slots.

Throughput is measured over the documents' prefill windows (`scheduler.sim.metrics.long_prefill_windows`). Inside
them a prefilling document holds a running slot, so a pass carries at most ``S`` = the running slots less one chats,
and each chat gets at most one token a pass. A run whose chats got ``N`` tokens inside the windows ran at least
``P = N / S`` passes there, whatever its policy, and every pass costs the preset's fixed cost. With the documents'
own compute ``D`` (their tokens and attention, which chunking does not change) and the compute ``C`` of the chat
work done inside the windows, the windows last at least ``T = (P^p f^p + (D + C)^p)^(1/p)``
(`CostModel.pass_s` is convex in a pass's compute, so ``P`` equal passes are the cheapest; ``p = 1``:
``P f + D + C``), against the baseline's measured windows ``W``: the run prefills documents at most ``W / T``
times as fast as the baseline.

A policy that keeps the chats' SLO serves them as they arrive, so where documents prefill all through the chats'
arrivals (a saturated scenario: `kv-burst`) nearly every chat token falls inside the windows, and the bound is the
price of the chats themselves, not of the policy. A run that serves fewer chat tokens there (it lets them queue
until the documents are done) gets a higher bound.
"""

from __future__ import annotations

from scheduler.pass_cost import chunk_ctx_pairs
from scheduler.sim.cost_model import CostModel
from scheduler.sim.metrics import long_prefill_windows
from scheduler.sim.presets import Preset
from scheduler.sim.request import SimRequest
from scheduler.sim.runner import RunResult
from scheduler.traffic import TrafficClass


def _inside(start: float, end: float, windows: list[tuple[float, float]]) -> bool:
    """Whether [start, end] lies within one window (a pass ending at a window's end is inside it)."""
    return any(a <= start and end <= b for a, b in windows)


def prefill_compute_s(cost: CostModel, req: SimRequest) -> float:
    """The compute of a request's uncached prompt, however it is chunked (attention pairs add up the same)."""
    n = req.prompt_tokens - req.cached_tokens
    return n / cost.prefill_tok_per_s + cost.attn_s_per_token_ctx * chunk_ctx_pairs(req.cached_tokens, n)


def chat_work_inside(cost: CostModel, req: SimRequest, windows: list[tuple[float, float]]) -> tuple[int, float]:
    """(tokens the chat got inside the windows, the compute of its work there): its prefill where the whole of it
    ran inside one window, and a decode row (attending to its context) per later token there."""
    times = req.token_times_s
    tokens, compute = 0, 0.0
    if times and req.admitted_s is not None and _inside(req.admitted_s, times[0], windows):
        tokens, compute = 1, prefill_compute_s(cost, req)
    for i, t in enumerate(times[1:], start=1):
        if _inside(t, t, windows):
            tokens += 1
            compute += cost.decode_row_s + cost.attn_s_per_token_ctx * (req.prompt_tokens + i - 1)
    return tokens, compute


def slot_ceiling(preset: Preset, baseline: RunResult, run: RunResult) -> float | None:
    """The bound on `run`'s document throughput over `baseline`'s, on the same workload (None: no documents, or no
    slot beside a document)."""
    cost = preset.cost
    base_windows = long_prefill_windows(baseline.requests)
    windows = long_prefill_windows(run.requests)
    docs = [r for r in run.requests if r.traffic_class is TrafficClass.LONG and r.first_token_s is not None]
    if not docs or not base_windows or not windows or preset.max_running_requests < 2:
        return None
    chats = [chat_work_inside(cost, r, windows) for r in run.requests if r.traffic_class is TrafficClass.SHORT]
    passes = sum(n for n, _ in chats) / (preset.max_running_requests - 1)
    compute = sum(prefill_compute_s(cost, r) for r in docs) + sum(c for _, c in chats)
    p = cost.overlap_p
    least_s = float(((passes * cost.fixed_s) ** p + compute**p) ** (1.0 / p))
    return sum(b - a for a, b in base_windows) / least_s
