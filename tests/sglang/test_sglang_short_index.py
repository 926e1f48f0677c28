"""A short request queued behind more documents than the lookahead is found through the plugin's index of short
waiting requests (`scheduler.sglang_plugin.short_index`) and admitted the pass it arrives, with sglang's own scan:
the plugin moves it behind the requests the planner walked, so sglang prefix-matches no document in between."""

from harness.sglang_classes import ReqSpec
from tests.sglang.test_sglang_idle_scan import POOL, blocked_queue, run_pair


def deep_question(num_docs: int) -> list[ReqSpec]:
    return [*blocked_queue(num_docs), ReqSpec("question", 30, arrive_pass=6)]


def test_a_question_behind_more_documents_than_the_lookahead_is_admitted_when_it_arrives():
    _, reusing = run_pair(POOL, deep_question(40), num_passes=10)
    assert reusing.history[6].admitted == [("question", 30)]
    # The walk judges "big" and the 16 behind it; the index finds the question: 17 + 1 matched by the planner,
    # and sglang's scan matches the same 17 again and the question, not the 23 documents between.
    assert reusing.matches[6] <= 2 * 18
    # Before it arrived, passes reused the idle scan (the index did not change) and matched nobody.
    assert reusing.matches[3:6] == [0] * 3
    waiting = reusing.history[6].waiting
    assert waiting[:2] == ["big", "w0"] and len(waiting) == 41 and "question" not in waiting


def test_strict_fcfs_does_not_use_the_index(monkeypatch):
    monkeypatch.setenv("FAIRSHARE_SKIP_AHEAD", "false")
    _, reusing = run_pair(POOL, deep_question(40), num_passes=10)
    assert all(rid != "question" for r in reusing.history for rid, _ in r.admitted)


def test_the_index_follows_arrivals_and_admissions():
    reqs = [*blocked_queue(30), ReqSpec("q1", 20, arrive_pass=3), ReqSpec("q2", 25, arrive_pass=5)]
    _, reusing = run_pair(POOL, reqs, num_passes=9)
    admitted = {rid: i for i, r in enumerate(reusing.history) for rid, _ in r.admitted}
    assert admitted["q1"] == 3 and admitted["q2"] == 5
    assert reusing.policy.short_index.reqs == []  # both left the queue: the index holds no admitted request
