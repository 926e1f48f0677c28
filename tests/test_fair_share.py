"""Chunk budgeting: fair shares, the F cap, uncontended full budget, the one-cut-request invariant."""

from scheduler.fair_share import sequential_fill, top_up, water_fill
from scheduler.planner import PassPlanner
from tests.factories import cand, cfg, snap

NO_ADAPT = dict(adaptive_pass=False)


def test_a_lone_request_gets_the_full_budget():
    plan = PassPlanner(cfg(**NO_ADAPT)).plan(snap([cand("doc", 130_000)]))
    assert plan.grants[0].tokens == 8192 and plan.grants[0].cut


def test_without_uncontended_lift_a_lone_request_is_capped_at_f():
    plan = PassPlanner(cfg(full_budget_when_alone=False, **NO_ADAPT)).plan(snap([cand("doc", 130_000)]))
    assert plan.grants[0].tokens == 409


def test_contended_long_requests_are_capped_at_f_and_shorts_get_what_they_need():
    planner = PassPlanner(cfg(**NO_ADAPT))
    plan = planner.plan(snap([cand("q", 30)], continuing=[cand("doc", 100_000)]))
    assert {g.rid: g.tokens for g in plan.grants} == {"doc": 409, "q": 30}


def test_never_two_cut_requests_in_one_pass():
    # sglang keeps one half-prefilled request: a second long one waits, and the first keeps the budget.
    planner = PassPlanner(cfg(**NO_ADAPT))
    plan = planner.plan(snap([cand("doc2", 50_000), cand("q", 30)], continuing=[cand("doc1", 100_000)]))
    assert plan.admitted_rids == ["doc1", "q"]
    assert sum(g.cut for g in plan.grants) == 1


def test_a_new_long_request_is_cut_when_no_other_is_half_prefilled():
    plan = PassPlanner(cfg(**NO_ADAPT)).plan(snap([cand("q", 30), cand("doc", 50_000)]))
    assert {g.rid: (g.tokens, g.cut) for g in plan.grants} == {"q": (30, False), "doc": (409, True)}


def test_the_fork_allows_several_cut_requests():
    plan = PassPlanner(cfg(**NO_ADAPT)).plan(
        snap([cand("d3", 50_000)], continuing=[cand("d1", 99_000), cand("d2", 99_000)], max_cut_requests=8)
    )
    assert [(g.rid, g.tokens) for g in plan.grants] == [("d1", 409), ("d2", 409), ("d3", 409)]


def test_shares_are_page_aligned():
    plan = PassPlanner(cfg(**NO_ADAPT)).plan(
        snap([cand("q", 30)], continuing=[cand("doc", 100_000)], granule_tokens=64)
    )
    doc = next(g for g in plan.grants if g.rid == "doc")
    assert doc.tokens % 64 == 0 and doc.tokens == 384


def test_budget_used_up_by_the_continuing_chunk_admits_nobody_new_under_upstream_rules():
    plan = PassPlanner(cfg(fair_share=False, **NO_ADAPT)).plan(snap([cand("q", 30)], continuing=[cand("doc", 99_999)]))
    assert plan.admitted_rids == ["doc"] and plan.grants[0].tokens == 8192


def test_mixed_decode_rows_take_budget():
    plan = PassPlanner(cfg(**NO_ADAPT, mixed_decode=True)).plan(snap([cand("doc", 100_000)], num_decoding=100))
    assert plan.pass_budget_tokens == 8192 - 100 and plan.grants[0].tokens == 8092


def test_water_fill_is_max_min_fair():
    assert water_fill([30, 10_000, 10_000], budget=1000) == [30, 485, 485]
    assert water_fill([30, 409], budget=1000) == [30, 409]
    assert water_fill([5, 5], budget=4) == [2, 2]
    assert water_fill([], budget=100) == []


def test_top_up_gives_spare_budget_in_order():
    shares = [30, 409, 409]
    top_up(shares, [30, 100_000, 100_000], budget=2048, eligible=[1, 2])
    assert shares == [30, 409 + 1200, 409]


def test_a_short_request_is_never_cut_for_f():
    plan = PassPlanner(cfg(per_request_cap_tokens=64, **NO_ADAPT)).plan(
        snap([cand("q", 200)], continuing=[cand("doc", 100_000)])
    )
    assert {g.rid: (g.tokens, g.cut) for g in plan.grants} == {"doc": (64, True), "q": (200, False)}


def test_a_half_prefilled_request_the_pass_can_finish_is_finished_so_the_next_can_start():
    # F=102 would leave 4 tokens of doc-a, blocking doc-b's cut; the spare budget finishes doc-a.
    plan = PassPlanner(cfg(per_request_cap_tokens=102, chunk_budget_tokens=2048, **NO_ADAPT)).plan(
        snap([cand("doc-b", 50_000)], continuing=[cand("doc-a", 106)])
    )
    assert {g.rid: (g.tokens, g.cut) for g in plan.grants} == {"doc-a": (106, False), "doc-b": (102, True)}


def test_with_adaptive_passes_spare_budget_goes_back_to_long_requests():
    plan = PassPlanner(cfg(quiet_pass_tokens=2048)).plan(snap([cand("doc-b", 50_000)], continuing=[cand("doc-a", 106)]))
    assert {g.rid: (g.tokens, g.cut) for g in plan.grants} == {"doc-a": (106, False), "doc-b": (1942, True)}


def test_sequential_fill_is_first_come():
    assert sequential_fill([5000, 5000, 10], budget=8192) == [5000, 3192, 0]
    assert sequential_fill([100, 9000], budget=8192, granule=64) == [100, 8064]
