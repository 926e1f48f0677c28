import logging
import random

from scheduler.diagnostics import pass_cost_line
from scheduler.pass_cost_fit import OnlinePassCost
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


def test_the_fit_line_shows_its_error_and_the_margin_it_states():
    fit = OnlinePassCost()
    assert pass_cost_line(fit.describe()).endswith("fits=0 error=- margin=15.0%")  # the prior's error
    rng = random.Random(1)
    for _ in range(64):
        tokens = rng.randrange(16, 4096)
        fit.observe(tokens, 0.0, 0, 0, 0.01 + 1e-5 * tokens * rng.choice([0.9, 1.0, 1.3]))
    line = pass_cost_line(fit.describe())
    assert f"margin={fit.relative_error:.1%}" in line and fit.relative_error != 0.15
