import logging

from scheduler.planner import PassPlanner
from tests.factories import cand, cfg, snap

SEED_CASE = [cand("doc-c", 70_689, 70_945), cand("q", 30, 286)]


def test_start_line_in_the_seeds_wording(caplog):
    with caplog.at_level(logging.INFO, logger="fairshare.scheduler"):
        PassPlanner(cfg(max_running_requests=10))
    assert "Prefill concurrency N=20: long_prefill_token_threshold=409" in caplog.messages


def test_rejection_and_budget_lines_when_enabled(caplog):
    planner = PassPlanner(cfg(diagnostics=True))
    with caplog.at_level(logging.INFO, logger="fairshare.scheduler"):
        planner.plan(snap(SEED_CASE, free_kv=68_534, continuing=[cand("doc-a", 50_000, 0)]))
    rejection, budget = caplog.messages
    assert rejection.startswith("res=NO_TOKEN need=70945 rem_total=68534 rem_chunk=7783 chunked=1/1 can_run=0")
    assert budget == "budget pass=94 cap=94 sharing=2 used=94 grants=[doc-a:64* q:30]"


def test_nothing_logged_when_disabled(caplog):
    planner = PassPlanner(cfg())
    with caplog.at_level(logging.DEBUG, logger="fairshare.scheduler"):
        planner.plan(snap(SEED_CASE, free_kv=68_534))
    assert caplog.messages == []
