"""Skip-ahead admission: the scan past capacity rejections, its bound, and anti-starvation."""

from scheduler.planner import PassPlanner
from scheduler.snapshot import QueueSnapshot
from tests.factories import FCFS, cand, cfg, snap


def test_empty_queue_admits_nothing():
    plan = PassPlanner().plan(snap([]))
    assert plan.grants == [] and plan.rejections == []


def test_big_request_rejected_for_capacity_no_longer_blocks_a_small_one():
    # The article's line: need=70945 rem_total=68534; the 30-token question behind it must be examined.
    waiting = [cand("doc", 70_689, 70_945), cand("q", 30, 286)]
    plan = PassPlanner().plan(snap(waiting, free_kv=68_534))
    assert plan.admitted_rids == ["q"]
    (rej,) = plan.rejections
    assert (rej.rid, rej.need_tokens, rej.rem_total_tokens, rej.skipped) == ("doc", 70_945, 68_534, True)


def test_strict_fcfs_stops_at_the_first_capacity_rejection():
    waiting = [cand("doc", 70_689, 70_945), cand("q", 30, 286)]
    plan = PassPlanner(cfg(**FCFS)).plan(snap(waiting, free_kv=68_534))
    assert plan.admitted_rids == []
    assert plan.rejections[0].skipped is False


def test_all_rejected():
    waiting = [cand(f"d{i}", 50_000) for i in range(5)]
    plan = PassPlanner().plan(snap(waiting, free_kv=10_000))
    assert plan.grants == []
    assert [r.rid for r in plan.rejections] == ["d0", "d1", "d2", "d3", "d4"]


def _blocked_then_small(position: int):
    """One big request, `position - 1` more big ones, then a small one at 1-based `position` behind the first."""
    return [cand("big0", 90_000)] + [cand(f"big{i}", 90_000) for i in range(1, position)] + [cand("small", 30)]


def test_lookahead_bound_is_exact():
    # After the first rejection exactly `lookahead` more requests are examined.
    planner = PassPlanner(cfg(lookahead=16))
    assert planner.plan(snap(_blocked_then_small(16), free_kv=10_000)).admitted_rids == ["small"]
    planner = PassPlanner(cfg(lookahead=16))
    plan = planner.plan(snap(_blocked_then_small(17), free_kv=10_000))
    assert plan.admitted_rids == []
    assert len(plan.rejections) == 17  # the first plus 16 more


def test_lookahead_zero_examines_nothing_past_a_rejection():
    plan = PassPlanner(cfg(lookahead=0)).plan(snap([cand("big", 90_000), cand("q", 30)], free_kv=10_000))
    assert plan.admitted_rids == []


def test_admission_respects_free_kv_across_admitted_requests():
    waiting = [cand("a", 4000, 6000), cand("b", 4000, 6000), cand("c", 100, 200)]
    plan = PassPlanner(cfg(fair_share=False, adaptive_pass=False)).plan(snap(waiting, free_kv=10_000))
    assert plan.admitted_rids == ["a", "c"]
    assert [r.rid for r in plan.rejections] == ["b"]


def test_running_slots_bound_admission():
    waiting = [cand(f"q{i}", 10) for i in range(10)]
    assert len(PassPlanner().plan(snap(waiting, slots=3)).grants) == 3


def test_a_request_skipped_too_long_cannot_be_overtaken_by_long_requests():
    planner = PassPlanner(cfg(max_skipped_passes=3, short_request_tokens=100))
    waiting = [cand("big", 90_000), cand("mid", 5_000), cand("q", 30)]
    for _ in range(3):  # skipped three passes: mid and q overtake it
        plan = planner.plan(snap(waiting, free_kv=60_000))
        assert plan.admitted_rids == ["mid", "q"]
    plan = planner.plan(snap(waiting, free_kv=60_000))
    # Reserved now: the long request behind it waits; the short one still passes.
    assert plan.admitted_rids == ["q"]
    # Once memory frees it is admitted first, and its reservation is gone.
    plan = planner.plan(snap(waiting, free_kv=200_000))
    assert plan.admitted_rids[0] == "big"
    assert "big" not in planner.ledger.first_skipped


def test_without_the_guard_small_requests_overtake_forever():
    planner = PassPlanner(cfg(max_skipped_passes=10**9))
    waiting = [cand("big", 90_000), cand("mid", 5_000)]
    for _ in range(50):
        assert planner.plan(snap(waiting, free_kv=60_000)).admitted_rids == ["mid"]


def test_decisions_are_deterministic():
    waiting = [cand(f"r{i}", (i * 7919) % 20_000 + 1) for i in range(40)]
    plans = [PassPlanner().plan(snap(waiting, free_kv=50_000, slots=8)) for _ in range(2)]
    assert plans[0] == plans[1]


class CountingQueue(list):
    """A waiting queue that counts how many entries the policy reads."""

    reads = 0

    def __iter__(self):
        for item in super().__iter__():
            CountingQueue.reads += 1
            yield item


def test_a_pass_reads_a_bounded_part_of_the_queue_whatever_its_length():
    reads = {}
    for n in (100, 10_000):
        CountingQueue.reads = 0
        waiting = CountingQueue([cand("big", 90_000)] + [cand(f"r{i}", 90_000 if i % 2 else 30) for i in range(n)])
        queue_snap = QueueSnapshot(waiting=waiting, free_kv_tokens=60_000, free_running_slots=4)
        CountingQueue.reads = 0
        PassPlanner(cfg(lookahead=16)).plan(queue_snap)
        reads[n] = CountingQueue.reads
    assert reads[100] == reads[10_000] <= 1 + 16 + 1


def test_skip_ahead_admissions_are_counted():
    planner = PassPlanner()
    plan = planner.plan(snap([cand("q0", 30), cand("doc", 90_000), cand("q1", 30), cand("q2", 30)], free_kv=60_000))
    assert plan.admitted_rids == ["q0", "q1", "q2"] and plan.num_skip_ahead == 2
    planner.plan(snap([cand("doc", 90_000), cand("q3", 30)], free_kv=60_000))
    assert planner.num_skip_ahead == 3
