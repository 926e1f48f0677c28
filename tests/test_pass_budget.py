"""Pass sizing by interactive activity."""

from scheduler.planner import PassPlanner
from tests.factories import cand, cfg, snap


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
    assert plan.pass_budget_tokens == 512


def test_decode_rows_come_out_of_the_chunk_budget_not_the_interactive_pass():
    # sglang's mixed chunk subtracts one token per decoding row from the whole chunk: 600 decoders leave a
    # 512-token interactive pass whole, and a 200-token question is admitted beside them.
    planner = PassPlanner(cfg(mixed_decode=True, interactive_pass_tokens=512, chunk_budget_tokens=8192))
    plan = planner.plan(snap([cand("q", 200)], continuing=[cand("doc", 90_000)], num_decoding=600))
    assert {g.rid: g.tokens for g in plan.grants} == {"q": 200, "doc": 64}
    plan = planner.plan(snap([], continuing=[cand("doc", 90_000)], num_decoding=600, num_short_decoding=600))
    assert plan.pass_budget_tokens == 512
    # Only when the rows leave less than the pass of the whole chunk does the pass shrink, never below one token.
    plan = planner.plan(snap([], continuing=[cand("doc", 90_000)], num_decoding=8000, num_short_decoding=1))
    assert plan.pass_budget_tokens == 192
    plan = planner.plan(snap([], continuing=[cand("doc", 90_000)], num_decoding=9000, num_short_decoding=1))
    assert plan.pass_budget_tokens == 1 and plan.grants[0].tokens == 1


def test_activity_window_counts_the_engines_forward_passes():
    # The window follows the engine's pass counter, decode-only passes included, not the plans built.
    planner = PassPlanner(cfg(quiet_pass_tokens=4096, interactive_pass_tokens=512, activity_window_passes=10))
    planner.plan(snap([cand("q", 30)], continuing=[cand("doc", 100_000)], pass_index=100))
    assert planner.plan(snap([], continuing=[cand("doc", 90_000)], pass_index=110)).pass_budget_tokens == 512
    assert planner.plan(snap([], continuing=[cand("doc", 90_000)], pass_index=111)).pass_budget_tokens == 4096


def test_adaptive_pass_off_always_allows_the_chunk_budget():
    planner = PassPlanner(cfg(adaptive_pass=False))
    planner.plan(snap([cand("q", 30)], continuing=[cand("doc", 100_000)]))
    assert planner.plan(snap([], continuing=[cand("doc", 90_000)])).pass_budget_tokens == 8192


def test_a_short_prompt_longer_than_the_chunk_gets_the_chunk_while_chats_lack_slots():
    # A short request may be longer than a small engine's chunk (short_request_tokens 2048, chunk 256): passes held
    # small for chats short of slots still stop at the chunk, as sglang's own chunking does.
    for slo_sizing in (False, True):
        knobs = dict(
            chunk_budget_tokens=256,
            interactive_pass_tokens=128,
            max_running_requests=3,
            slo_sizing=slo_sizing,
            mixed_decode=False,
        )
        planner = PassPlanner(cfg(**knobs))
        plan = planner.plan(snap([cand("m", 373)], slots=1, num_decoding=2, num_short_decoding=2))
        assert plan.sized_by == "slots" and plan.pass_budget_tokens == 256
        assert [(g.rid, g.tokens) for g in plan.grants] == [("m", 256)]
