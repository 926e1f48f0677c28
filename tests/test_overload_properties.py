"""Invariants of the policy on random workloads, each simulated to completion (hypothesis).

Random mixes of long and short prompts, arrivals in bursts or Poisson, KV pools from tight to ample, slot
limits, cached prefixes; the `fairshare` rules on a small card. Every run must finish every request, never
commit more KV than the pool, keep at most one half-prefilled request, admit a short request that fits
(in KV and slots) within a bounded number of passes, and let later short requests overtake an earlier one
by at most the lookahead. With every switch off the policy takes upstream's decisions (the reference of
`test_fcfs_reference`)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.config import PolicyConfig
from scheduler.planner import PassPlanner
from scheduler.sim.cost_model import CostModel
from scheduler.sim.engine import SimEngine, StepResult
from scheduler.sim.presets import Preset
from scheduler.sim.request import Phase, SimRequest
from scheduler.sim.rules import make_scheduler
from scheduler.sim.runner import run
from scheduler.snapshot import Candidate, QueueSnapshot
from scheduler.traffic import TrafficClass
from tests.factories import FCFS
from tests.hypothesis_budget import examples
from tests.test_fcfs_reference import upstream_reference

SHORT_TOKENS = 2048
FIT_BOUND_PASSES = 3
"""A short request that fits is admitted within this many passes (a decode-only pass owed to short
streams, the pass in which shorts ahead of it take the slot or KV it saw free)."""


def card(pool: int, slots: int) -> Preset:
    return Preset(
        name="prop",
        cost=CostModel(
            name="prop",
            fixed_s=0.01,
            prefill_tok_per_s=20_000.0,
            decode_row_s=1e-4,
            attn_s_per_token_ctx=1e-10,
            kv_pool_tokens=pool,
        ),
        chunk_budget_tokens=2048,
        baseline_chunk_tokens=2048,
        max_running_requests=slots,
    )


@st.composite
def workloads(draw) -> tuple[Preset, list[SimRequest]]:
    pool = draw(st.sampled_from([12_000, 30_000, 80_000, 400_000]))
    slots = draw(st.integers(2, 12))
    n = draw(st.integers(1, 24))
    bursty = draw(st.booleans())
    rate = draw(st.floats(0.5, 20.0))
    rng = random.Random(draw(st.integers(0, 2**32)))
    reqs, t = [], 0.0
    for i in range(n):
        long_ = rng.random() < draw(st.floats(0.0, 0.7))
        output = rng.randint(1, 64)
        prompt = rng.randint(SHORT_TOKENS + 1, min(40_000, pool - output)) if long_ else rng.randint(1, 600)
        cached = rng.randint(0, prompt - 1) if rng.random() < 0.2 else 0
        reqs.append(
            SimRequest(
                f"r{i}",
                prompt,
                output,
                t,
                TrafficClass.LONG if long_ else TrafficClass.SHORT,
                cached_tokens=cached,
            )
        )
        t += 0.0 if bursty and rng.random() < 0.7 else rng.expovariate(rate)
    return card(pool, slots), reqs


class Watch:
    """Checks each pass of one run."""

    def __init__(self, cfg: PolicyConfig) -> None:
        self.cfg = cfg
        self.fit_passes: dict[str, int] = {}
        self.fit_seen: dict[str, int] = {}
        self.admit_order: list[str] = []
        self._fits_now: set[str] = set()

    def before(self, engine: SimEngine) -> None:
        # Short requests that fit in what is free at plan time (KV and one slot; the reserve is theirs).
        self._fits_now = {
            r.rid
            for r in engine.waiting
            if self.cfg.is_short(r.extend_tokens)
            and engine.free_running_slots > 0
            and r.kv_need_tokens <= engine.free_kv_tokens
        }
        self._waiting = {r.rid for r in engine.waiting}

    def after(self, engine: SimEngine, result: StepResult) -> None:
        assert 0 <= engine.kv_used_tokens <= engine.cost.kv_pool_tokens
        assert len(engine.running) <= self.cfg.max_running_requests
        cut = [r for r in engine.running if r.phase is Phase.PREFILLING and r.num_prefilled > 0 and r.extend_tokens]
        assert len(cut) <= 1
        still_waiting = {r.rid for r in engine.waiting}
        self.admit_order += [rid for rid in self._waiting if rid not in still_waiting]
        for rid in self._fits_now & still_waiting:
            self.fit_passes[rid] = self.fit_passes.get(rid, 0) + 1
            assert self.fit_passes[rid] <= FIT_BOUND_PASSES, f"{rid} fit for {self.fit_passes[rid]} passes"
        for rid in self._waiting - self._fits_now:
            self.fit_passes.pop(rid, None)  # the bound counts consecutive passes in which it fit


@settings(max_examples=80, deadline=None, derandomize=True)
@given(workloads())
def test_random_workloads_finish_within_the_invariants(case):
    preset, reqs = case
    scheduler = make_scheduler("fairshare", preset)
    cfg = scheduler.cfg
    watch = Watch(cfg)
    result = run(reqs, preset, scheduler, before_step=watch.before, after_step=watch.after)
    assert all(r.phase is Phase.FINISHED for r in result.requests)
    # Later short requests overtake an earlier one by at most the lookahead.
    arrival = {r.rid: (r.arrival_s, int(r.rid[1:])) for r in result.requests}
    shorts = [r.rid for r in result.requests if cfg.is_short(r.prompt_tokens - r.cached_tokens)]
    position = {rid: i for i, rid in enumerate(watch.admit_order)}
    for rid in shorts:
        overtakers = [o for o in shorts if arrival[o] > arrival[rid] and position[o] < position[rid]]
        assert len(overtakers) <= cfg.lookahead, (rid, overtakers)


@st.composite
def snapshots(draw) -> QueueSnapshot:
    size = st.one_of(st.integers(1, 200), st.integers(200, 4000), st.integers(4000, 120_000))
    waiting = [
        Candidate(f"w{i}", e, e + draw(st.integers(0, 512))) for i, e in enumerate(draw(st.lists(size, max_size=12)))
    ]
    continuing = [Candidate("chunked", draw(size), 0)] if draw(st.booleans()) else []
    return QueueSnapshot(
        waiting=waiting,
        free_kv_tokens=draw(st.integers(0, 250_000)),
        free_running_slots=draw(st.integers(0, 8)),
        continuing=continuing,
        num_decoding=draw(st.integers(0, 50)),
        granule_tokens=draw(st.sampled_from([1, 16, 64])),
        waiting_short=[c for c in waiting if c.extend_tokens <= SHORT_TOKENS],
    )


@settings(max_examples=examples(400), deadline=None, derandomize=True)
@given(snapshots(), st.sampled_from([2048, 4096, 8192]))
def test_with_every_switch_off_decisions_equal_upstream(snap, budget):
    cfg = PolicyConfig(**FCFS, short_decode_interleave=False, mixed_decode=False, chunk_budget_tokens=budget)
    got = [(g.rid, g.tokens) for g in PassPlanner(cfg).plan(snap).grants]
    assert got == upstream_reference(snap, budget)
