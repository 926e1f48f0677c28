"""With skip-ahead, fair share and adaptive passes off, the plugin takes upstream sglang's decisions:
pass by pass, the patched `_get_new_batch_prefill_raw` admits the same requests, with the same prefill
tokens, as the unpatched method on the same queue (random queues, page sizes, pools, mixed chunk)."""

import random
from dataclasses import replace

import pytest

from harness.sglang_classes import EngineSpec, Harness, ReqSpec
from tests.sglang.sglang_scenarios import SHARED_SCENARIOS

FCFS_ENV = {
    "FAIRSHARE_SKIP_AHEAD": "false",
    "FAIRSHARE_FAIR_SHARE": "false",
    "FAIRSHARE_ADAPTIVE_PASS": "false",
    "FAIRSHARE_INTERACTIVE_RESERVE": "false",
    "FAIRSHARE_SHORT_DECODE_INTERLEAVE": "false",
}


@pytest.fixture
def fcfs(monkeypatch):
    for name, value in FCFS_ENV.items():
        monkeypatch.setenv(name, value)


def random_scenario(rng: random.Random) -> tuple[EngineSpec, list[ReqSpec]]:
    engine = EngineSpec(
        pool_tokens=rng.choice([2048, 4096, 8192]),
        page_size=rng.choice([1, 1, 4, 16]),
        chunk_tokens=rng.choice([256, 512, 1024, None]),
        max_running=rng.choice([2, 4, 8, 16]),
        req_rows=rng.choice([3, 8, 64]),
        mixed_chunk=rng.random() < 0.4,
    )
    reqs: list[ReqSpec] = []
    for i in range(rng.randint(1, 12)):
        size = rng.choice([rng.randint(1, 64), rng.randint(64, 1500), rng.randint(1500, 6000)])
        spec = ReqSpec(
            f"q{i}",
            size,
            max_new_tokens=rng.randint(1, 300),
            arrive_pass=rng.randint(0, 6),
            decode_passes=rng.randint(1, 5),
        )
        if reqs and rng.random() < 0.2:  # a prefix-cache hit on an earlier request
            parent = rng.choice(reqs)
            prompt = max(size, parent.prompt_tokens // 2 + 1)
            spec = replace(
                spec, prompt_tokens=prompt, prefix_of=parent.rid, prefix_tokens=min(parent.prompt_tokens, prompt) - 1
            )
        reqs.append(spec)
    return engine, reqs


def assert_same_passes(engine: EngineSpec, reqs: list[ReqSpec], num_passes: int) -> int:
    upstream = Harness(engine, reqs, patched=False)
    plugin = Harness(engine, reqs, patched=True)
    num_admitted = 0
    for i in range(num_passes):
        want, got = upstream.step(), plugin.step()
        assert (got.admitted, got.chunked, got.waiting) == (want.admitted, want.chunked, want.waiting), (
            f"pass {i}: {engine}"
        )
        num_admitted += len(got.admitted)
    return num_admitted


def test_random_queues_pass_by_pass(fcfs):
    rng = random.Random(20231)
    num_admitted = sum(assert_same_passes(*random_scenario(rng), num_passes=25) for _ in range(80))
    assert num_admitted > 500  # the scenarios do admit, chunk and reject


@pytest.mark.parametrize("make", SHARED_SCENARIOS, ids=lambda f: f.__name__)
def test_shared_scenarios_pass_by_pass(fcfs, make):
    scenario = make()
    assert_same_passes(scenario.engine, scenario.reqs, scenario.num_passes)


def test_big_request_still_blocks_the_small_one(fcfs):
    """Strict FCFS is upstream's: the small request behind a capacity rejection waits."""
    reqs = [ReqSpec("holder", 2000, decode_passes=50), ReqSpec("big", 2500), ReqSpec("small", 10)]
    plugin = Harness(EngineSpec(pool_tokens=4096, chunk_tokens=2048), reqs)
    plugin.run(3)
    assert plugin.history[0].admitted == [("holder", 2000)]
    assert [r.rid for r in plugin.sched.waiting_queue] == ["big", "small"]
    assert plugin.running.batch_is_full  # upstream's NO_TOKEN handling ran
