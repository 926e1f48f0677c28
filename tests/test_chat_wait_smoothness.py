"""A chat's wait grows smoothly with the pass size (hypothesis, simulated on random workloads).

Static passes of 1,024-2,048 tokens used to make chats wait seconds on h100-8b's bursts, where 256 gave 0.2 s:
a stream holds its running slot for as many passes as it has tokens, so bigger passes kept more chats decoding at
once, the slots filled, and each new chat waited for a stream to finish at the big passes' pace. Now passes carry
no long prefill while short requests lack slots (`scheduler.pass_budget.slots_short`), so that wait runs at decode
speed whatever the pass size.

The property, for static pass sizes P from 128 to 2,048 tokens on the same workload: the chats' TTFT p99 at P is
at most twice that at 128 tokens, plus two passes of P (the pass in flight and the one that frees a slot), plus the
longest a stream can hold its slot at decode speed (its output tokens times a decode step). A wait that scales with
the pass size times a stream's remaining tokens breaks it (it does with `slot_aware_passes=false`).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.sim.cost_model import CostModel
from scheduler.sim.presets import Preset
from scheduler.sim.request import SimRequest
from scheduler.sim.rules import make_scheduler
from scheduler.sim.runner import run
from scheduler.traffic import TrafficClass

# 40 workloads, each simulated at five pass sizes: about 15 s on one core, so `make test` runs it, not test-fast.
pytestmark = pytest.mark.slow

PASS_TOKENS = [128, 256, 512, 1024, 2048]


def card(slots: int) -> Preset:
    return Preset(
        name="smooth",
        cost=CostModel(
            name="smooth",
            fixed_s=0.01,
            prefill_tok_per_s=20_000.0,
            decode_row_s=1e-4,
            attn_s_per_token_ctx=1e-10,
            kv_pool_tokens=400_000,
        ),
        chunk_budget_tokens=2048,
        baseline_chunk_tokens=2048,
        max_running_requests=slots,
    )


@st.composite
def workloads(draw) -> tuple[Preset, list[SimRequest]]:
    """Documents and a stream of chats on a card with few running slots, at chat rates around and above what
    big passes let the slots serve."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    slots = draw(st.integers(3, 8))
    rate = draw(st.floats(5.0, 30.0))
    reqs = [
        SimRequest(f"d{i}", rng.randint(5_000, 60_000), rng.randint(1, 32), rng.uniform(0, 2), TrafficClass.LONG)
        for i in range(draw(st.integers(1, 4)))
    ]
    t = 0.0
    for i in range(draw(st.integers(20, 60))):
        t += rng.expovariate(rate)
        reqs.append(SimRequest(f"c{i}", rng.randint(10, 400), rng.randint(16, 96), t, TrafficClass.SHORT))
    return card(slots), reqs


def chat_ttft_p99(preset: Preset, reqs: list[SimRequest], pass_tokens: int) -> float:
    spec = f"fairshare:slo_sizing=false,interactive_pass_tokens={pass_tokens},quiet_pass_tokens={pass_tokens}"
    result = run(reqs, preset, make_scheduler(spec, preset), policy=spec)
    return float(np.percentile([r.ttft_s for r in result.requests if r.traffic_class is TrafficClass.SHORT], 99))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(workloads())
def test_a_chats_wait_grows_smoothly_with_the_pass_size(case):
    preset, reqs = case
    cost, slots = preset.cost, preset.max_running_requests
    decode_bound_s = max(r.output_tokens for r in reqs) * cost.pass_s(1, 0.0, slots, 0)
    ttfts = [chat_ttft_p99(preset, reqs, p) for p in PASS_TOKENS]
    smallest = ttfts[0]
    for ttft, p in zip(ttfts[1:], PASS_TOKENS[1:], strict=True):
        assert ttft <= 2 * smallest + 2 * cost.pass_s(p, 0.0, slots, 0) + decode_bound_s, (p, ttfts)
