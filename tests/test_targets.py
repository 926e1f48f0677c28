"""Issue targets for our policy on the card12gb-27b preset, measured on the simulator's virtual clock
(deterministic: these are model outcomes, not wall-clock timings)."""

import pytest

from scheduler.sim.experiments import UNCHUNKED, long_tok_per_s, run_spec, short_ttfts
from scheduler.sim.frontier import sweep
from scheduler.sim.metrics import measure
from scheduler.sim.presets import CARD12GB
from scheduler.sim.workload import doc_4parallel, doc_4sessions, doc_lone


@pytest.fixture(scope="module")
def frontier():
    return sweep(CARD12GB)


@pytest.mark.slow
def test_our_frontier_dominates_the_forks(frontier):
    for point in frontier.curve("article-patch"):
        assert frontier.dominated(point, "fairshare"), point


@pytest.mark.slow
def test_at_95_percent_lone_speed_a_question_waits_under_a_second(frontier):
    fast = [p for p in frontier.curve("fairshare") if p.lone_fraction >= 0.95]
    assert min(p.short_ttft_s for p in fast) <= 1.0


@pytest.mark.slow
def test_at_the_forks_lone_speed_a_question_waits_less_than_in_the_fork(frontier):
    (patch,) = [p for p in frontier.curve("article-patch") if p.knob == 409]
    ours = [p for p in frontier.curve("fairshare") if p.lone_fraction >= patch.lone_fraction]
    assert min(p.short_ttft_s for p in ours) <= 0.8 * patch.short_ttft_s


# A pass planned with no chat around is bounded by the TTFT target too (a chat may arrive during it), so what a
# document alone gets follows from that target: the card's default 0.8 s leaves ~0.5 s passes. A target that leaves
# room for the frontier's 1,792-token pass (2 s on this card) gives the speeds the static quiet pass gave.
ROOMY_TTFT = "fairshare:ttft_target_s=2.0"


def test_a_lone_document_speeds_up_with_the_ttft_target_up_to_98_percent_of_unchunked():
    unchunked = long_tok_per_s(run_spec(doc_lone(), UNCHUNKED, CARD12GB))
    speeds = [long_tok_per_s(run_spec(doc_lone(), f"fairshare:ttft_target_s={t}", CARD12GB)) for t in (0.8, 1.2, 2.0)]
    assert speeds == sorted(speeds)
    assert speeds[-1] >= 0.98 * unchunked


def test_four_parallel_documents_keep_95_percent_of_unchunked_speed_at_a_roomy_ttft_target():
    ours = long_tok_per_s(run_spec(doc_4parallel(), ROOMY_TTFT, CARD12GB))
    assert ours >= 0.95 * long_tok_per_s(run_spec(doc_4parallel(), UNCHUNKED, CARD12GB))


def test_four_sessions_short_ttft_p99_under_0_8_s_and_steady_decoding():
    result = run_spec(doc_4sessions(), "fairshare", CARD12GB)
    m = measure(result)
    short = m.classes["short"]
    assert short.ttft_s.p99 <= 0.80
    assert short.itl_during_long_prefill_s.p99 <= 2.5 * m.decode_only_step_s
    assert short.decode_passes_stalled == 0
    assert len(short_ttfts(result)) == 12
