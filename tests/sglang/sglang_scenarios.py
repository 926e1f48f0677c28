"""Shared scenarios: the simulator's named workloads (`scheduler.sim.workload.SCENARIOS`), scaled down so
sglang's real admission code runs them on CPU in milliseconds, plus the engine each runs on.

Long requests are scaled by `token_scale` (prompt, output and the KV pool alike, so the memory pressure
of the original stays); short requests keep their size. Arrival times become pass indices at the article's
prefill rate: a pass prefills at most `chunk_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.sglang_classes import EngineSpec, ReqSpec
from scheduler.sim.presets import CARD12GB_PREFILL_TOK_PER_S
from scheduler.sim.workload import SCENARIOS
from scheduler.traffic import TrafficClass


@dataclass(frozen=True)
class Scenario:
    name: str
    engine: EngineSpec
    reqs: list[ReqSpec]
    num_passes: int


def from_workload(name: str, engine: EngineSpec, token_scale: int, num_passes: int, decode_passes: int = 3) -> Scenario:
    assert engine.chunk_tokens is not None
    reqs = []
    for r in SCENARIOS[name]().requests():
        scale = token_scale if r.traffic_class is TrafficClass.LONG else 1
        arrive = int(r.arrival_s * CARD12GB_PREFILL_TOK_PER_S / token_scale / engine.chunk_tokens)
        reqs.append(
            ReqSpec(
                r.rid,
                max(1, r.prompt_tokens // scale),
                max_new_tokens=max(1, r.output_tokens // scale),
                arrive_pass=arrive,
                decode_passes=decode_passes,
            )
        )
    return Scenario(f"{name}/{token_scale}", engine, reqs, num_passes)


def doc_4sessions() -> Scenario:
    """Two documents fill the pool, the third is rejected for capacity, questions arrive behind it."""
    return from_workload(
        "doc-4sessions",
        EngineSpec(pool_tokens=262_144 // 16, chunk_tokens=2048, max_running=10, req_rows=32),
        token_scale=16,
        num_passes=30,
    )


def doc_question() -> Scenario:
    """A cold document; a question arrives during its prefill."""
    return from_workload(
        "doc-question",
        EngineSpec(pool_tokens=262_144 // 16, chunk_tokens=2048, max_running=10, req_rows=32),
        token_scale=16,
        num_passes=12,
    )


def chunk_steps() -> Scenario:
    """The step-comparison article's simulation: 8 shorts decoding, a 10k-token prompt at step 10, two late shorts."""
    reqs = [
        ReqSpec(r.rid, r.prompt_tokens, max_new_tokens=r.output_tokens, arrive_pass=int(r.arrival_s), decode_passes=6)
        for r in SCENARIOS["chunk-steps"]().requests()
    ]
    return Scenario(
        "chunk-steps", EngineSpec(pool_tokens=65_536, chunk_tokens=4096, max_running=32, req_rows=64), reqs, 22
    )


SHARED_SCENARIOS = [doc_4sessions, doc_question, chunk_steps]
