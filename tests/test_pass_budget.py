"""Pass sizing by interactive activity."""

from factories import cand, cfg, snap

from scheduler.planner import PassPlanner


def test_quiet_passes_use_the_quiet_budget():
    planner = PassPlanner(cfg(quiet_pass_tokens=2048))
    assert planner.plan(snap([cand("doc", 100_000)])).grants[0].tokens == 2048


def test_a_new_short_request_runs_in_a_pass_nearly_of_its_own():
    planner = PassPlanner(cfg(short_pass_extra_tokens=64))
    plan = planner.plan(snap([cand("q", 30)], continuing=[cand("doc", 100_000)]))
    assert {g.rid: g.tokens for g in plan.grants} == {"q": 30, "doc": 64}


def test_passes_stay_small_while_short_requests_are_recent_then_grow_back():
    planner = PassPlanner(cfg(quiet_pass_tokens=4096, interactive_pass_tokens=512, activity_window_passes=3))
    planner.plan(snap([cand("q", 30)], continuing=[cand("doc", 100_000)]))
    budgets = [planner.plan(snap([], continuing=[cand("doc", 90_000)])).pass_budget_tokens for _ in range(5)]
    assert budgets == [512, 512, 512, 4096, 4096]


def test_short_streams_decoding_keep_passes_interactive():
    planner = PassPlanner(cfg(quiet_pass_tokens=4096, interactive_pass_tokens=512))
    plan = planner.plan(snap([], continuing=[cand("doc", 90_000)], num_decoding=3, num_short_decoding=1))
    assert plan.pass_budget_tokens == 512 - 3


def test_adaptive_pass_off_always_allows_the_chunk_budget():
    planner = PassPlanner(cfg(adaptive_pass=False))
    planner.plan(snap([cand("q", 30)], continuing=[cand("doc", 100_000)]))
    assert planner.plan(snap([], continuing=[cand("doc", 90_000)])).pass_budget_tokens == 8192
