"""Issue targets for our policy on the seed000 preset, measured on the simulator's virtual clock
(deterministic: these are model outcomes, not wall-clock timings)."""

import pytest

from scheduler.sim.experiments import UNCHUNKED, long_tok_per_s, run_spec, short_ttfts
from scheduler.sim.frontier import sweep
from scheduler.sim.metrics import measure
from scheduler.sim.presets import SEED000
from scheduler.sim.workload import seed000_4parallel, seed000_4sessions, seed000_lone


@pytest.fixture(scope="module")
def frontier():
    return sweep(SEED000)


def test_our_frontier_dominates_the_forks(frontier):
    for point in frontier.curve("seed000"):
        assert frontier.dominated(point, "fairshare"), point


def test_at_95_percent_lone_speed_a_question_waits_under_a_second(frontier):
    fast = [p for p in frontier.curve("fairshare") if p.lone_fraction >= 0.95]
    assert min(p.short_ttft_s for p in fast) <= 1.0


def test_at_the_forks_lone_speed_a_question_waits_less_than_in_the_fork(frontier):
    (fork,) = [p for p in frontier.curve("seed000") if p.knob == 409]
    ours = [p for p in frontier.curve("fairshare") if p.lone_fraction >= fork.lone_fraction]
    assert min(p.short_ttft_s for p in ours) <= 0.8 * fork.short_ttft_s


def test_a_lone_document_keeps_98_percent_of_unchunked_speed():
    lone = long_tok_per_s(run_spec(seed000_lone(), "fairshare", SEED000))
    assert lone >= 0.98 * long_tok_per_s(run_spec(seed000_lone(), UNCHUNKED, SEED000))


def test_four_parallel_documents_keep_95_percent_of_unchunked_speed():
    ours = long_tok_per_s(run_spec(seed000_4parallel(), "fairshare", SEED000))
    assert ours >= 0.95 * long_tok_per_s(run_spec(seed000_4parallel(), UNCHUNKED, SEED000))


def test_four_sessions_short_ttft_p99_under_0_8_s_and_steady_decoding():
    result = run_spec(seed000_4sessions(), "fairshare", SEED000)
    m = measure(result)
    short = m.classes["short"]
    assert short.ttft_s.p99 <= 0.80
    assert short.itl_during_long_prefill_s.p99 <= 2.5 * m.decode_only_step_s
    assert short.decode_passes_stalled == 0
    assert len(short_ttfts(result)) == 12
