"""Reusing the last idle scan (`scheduler.sglang_plugin.idle_scan`) changes no decision: pass by pass, a plugin
that reuses it admits, cuts and leaves waiting exactly what a plugin that matches and plans afresh every pass
does, and its planner's state across passes (starvation ledger, pass sizer) is the same. A new arrival, freed KV
or a freed slot makes it scan again; a pass that cannot admit anyone matches no request at all.

Between passes the harness decays sglang's new-token ratio as sglang's decode steps do, so free KV moves every
pass as in a real server, without a request finishing."""

from __future__ import annotations

import os
from array import array
from dataclasses import dataclass, field, replace
from unittest import mock

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.radix_cache import RadixKey

from harness.sglang_classes import EngineSpec, Harness, PassRecord, ReqSpec
from scheduler.sglang_plugin import hooks

RATIO_DECAY = 0.01
MIN_RATIO = 0.1


@dataclass
class DecodingHarness(Harness):
    """A harness whose passes also decay sglang's new-token ratio (as `update_running_batch` does), and that
    counts the prefix matches each pass makes."""

    matches: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    """Per pass: "fresh" (matched and planned), "reused" (planned on the idle scan in sglang's adder),
    "no-adder" (planned on it before sglang built an adder), "repeat" (the pass before's plan, repeated without
    an adder) or "-" (sglang did not call the plugin)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        tree = self.sched.tree_cache
        self._match = tree.match_prefix
        self._num_matches = 0

        def counting_match(*args, **kwargs):
            self._num_matches += 1
            return self._match(*args, **kwargs)

        tree.match_prefix = counting_match

    def step(self) -> PassRecord:
        self._num_matches = 0
        planned, before = self.policy.num_planned_passes, self.policy.last_run
        record = super().step()
        self.matches.append(self._num_matches)
        run = self.policy.last_run
        if self.policy.num_planned_passes == planned:
            self.kinds.append("-")
        elif run is before:
            self.kinds.append("repeat")
        else:
            self.kinds.append("fresh" if not run.reused_scan else ("reused" if run.adder is not None else "no-adder"))
        ratio = self.sched.new_token_ratio_tracker
        ratio.current = max(MIN_RATIO, ratio.current - RATIO_DECAY)
        return record


def planner_state(h: Harness) -> tuple:
    planner = h.policy.planner
    return dict(planner.ledger.first_skipped), planner.sizer.last_short_pass, planner.num_skip_ahead, planner.num_plans


def run_pair(engine: EngineSpec, reqs: list[ReqSpec], num_passes: int) -> tuple[DecodingHarness, DecodingHarness]:
    """Run with and without reuse side by side; every pass must decide the same."""
    fresh = DecodingHarness(engine, reqs)
    fresh.policy.reuse_idle_scans = False
    reusing = DecodingHarness(engine, reqs)
    for i in range(num_passes):
        want, got = fresh.step(), reusing.step()
        assert got == want, f"pass {i}: {engine}"
        assert planner_state(reusing) == planner_state(fresh), f"pass {i}"
    assert fresh.policy.num_reused_scans == 0
    assert reusing.policy.num_planned_passes == fresh.policy.num_planned_passes
    return fresh, reusing


# 4,096 KV tokens; "holder" keeps 2,000 (+ its output reservation) while it decodes, so "big" does not fit.
POOL = EngineSpec(pool_tokens=4096, chunk_tokens=2048, max_running=16, new_token_ratio=0.7)


def blocked_queue(num_waiting: int, arrive_pass: int = 1) -> list[ReqSpec]:
    reqs = [
        ReqSpec("holder", 2000, max_new_tokens=1000, decode_passes=10_000),
        ReqSpec("big", 2500, max_new_tokens=32, arrive_pass=arrive_pass),
    ]
    return reqs + [ReqSpec(f"w{i}", 2100 + i, arrive_pass=arrive_pass) for i in range(num_waiting)]


def test_passes_that_cannot_admit_match_nobody():
    fresh, reusing = run_pair(POOL, blocked_queue(40), num_passes=30)
    assert [rid for r in reusing.history for rid, _ in r.admitted] == ["holder"]
    # Pass 1 judges "big" and the lookahead's 16 behind it; the free KV they need never comes (the ratio decays
    # by too little), so every later pass plans on that scan's figures and matches nothing.
    assert reusing.matches[1] == 17
    assert reusing.matches[2:] == [0] * 28
    assert fresh.matches[2:] == [17] * 28
    # The pool's free tokens alone are below every need: sglang does not even build an adder, and from the second
    # such pass on, the plan before stands again (nothing it read has changed but the counter and the free KV).
    assert reusing.kinds[2:] == ["no-adder"] + ["repeat"] * 27
    assert reusing.policy.num_reused_scans == 28
    # The ledger still knows "big" was skipped (its reservation ages with the forward passes, reused or not).
    assert "big" in reusing.policy.planner.ledger.first_skipped


def test_an_arrival_rescans_and_is_admitted_in_the_same_pass():
    reqs = [*blocked_queue(3), ReqSpec("question", 30, arrive_pass=6)]
    _, reusing = run_pair(POOL, reqs, num_passes=10)
    assert reusing.history[6].admitted == [("question", 30)]
    assert reusing.matches[6] > 0
    assert reusing.matches[2:6] == [0] * 4


def test_freed_kv_rescans_when_a_rejected_request_could_fit(monkeypatch):
    """The ratio decays every pass; the scan is reused until free KV reaches "big"'s need. Then a fresh scan
    admits "big" and, its first rejection now being "huge", looks one request further and admits "small"
    too: in the very pass a plugin that never reuses admits them. ("small" counts as long here: a short request
    would be found through the index of short waiting requests in the first pass, whatever the lookahead, and
    the reserve is off so that the pool's last tokens go to it; `test_random_queues_do_reuse_scans` reuses under
    the reserve.)"""
    monkeypatch.setenv("FAIRSHARE_LOOKAHEAD", "1")
    monkeypatch.setenv("FAIRSHARE_SHORT_REQUEST_TOKENS", "3")
    monkeypatch.setenv("FAIRSHARE_INTERACTIVE_RESERVE", "false")
    engine = EngineSpec(pool_tokens=4096, chunk_tokens=4096, max_running=16, new_token_ratio=0.7)
    reqs = [
        ReqSpec("holder", 1000, max_new_tokens=2500, decode_passes=10_000),
        ReqSpec("big", 1800, arrive_pass=1),
        ReqSpec("huge", 5000, arrive_pass=1),
        ReqSpec("small", 4, max_new_tokens=1, arrive_pass=1),
    ]
    _, reusing = run_pair(engine, reqs, num_passes=50)
    admitted_at = next(i for i, r in enumerate(reusing.history) if i > 0 and r.admitted)
    assert admitted_at > 5  # it waited for the ratio to decay
    assert [rid for rid, _ in reusing.history[admitted_at].admitted] == ["big", "small"]
    assert reusing.matches[2:admitted_at] == [0] * (admitted_at - 2)
    # The running stream's reservation, not the pool, keeps "big" out: only the adder can tell, so it is built.
    assert reusing.kinds[2:admitted_at] == ["reused"] * (admitted_at - 2)
    assert reusing.kinds[admitted_at] == "fresh"


def test_a_finishing_request_rescans():
    """A request leaving the running batch frees KV and a slot and adds its tokens to the cache: the next pass
    matches the waiting requests again."""
    reqs = [
        ReqSpec("holder", 2000, max_new_tokens=1000, decode_passes=10_000),
        ReqSpec("brief", 100, max_new_tokens=8, decode_passes=6),
        ReqSpec("big", 2500, arrive_pass=1),
        ReqSpec("w0", 2200, arrive_pass=1),
    ]
    _, reusing = run_pair(POOL, reqs, num_passes=12)
    # Pass 1 finishes the holder's prefill (a continuing chunk: never reused). Pass 2 runs decode only: with
    # sglang's mixed chunk off, the policy owes "brief"'s short stream a decode-only pass after each prefill pass
    # (issue 8), and sglang does not scan the queue. Pass 3 judges both waiting requests, and is reused after.
    assert reusing.kinds[2] == "-" and reusing.matches[2] == 0
    assert reusing.matches[3] == 2
    assert reusing.matches[4:6] == [0] * 2
    assert reusing.history[6].admitted == []  # "brief" finishes after pass 6
    assert reusing.matches[7] == 2
    assert reusing.matches[8:] == [0] * 4


def idle_state(h: Harness):
    scan = h.policy.last_run.idle_scan
    return scan, scan.state_without_adder(h.sched, h.running, h.policy.cfg)


def test_each_change_a_scan_read_makes_it_stale():
    h = DecodingHarness(POOL, blocked_queue(3))
    h.run(4)
    scan, state = idle_state(h)
    sched, cfg = h.sched, h.policy.cfg
    assert scan is not None and h.policy.last_run.reused_scan
    assert scan.still_holds(sched, state, cfg)
    assert scan.still_holds(sched, replace(state, free_kv_tokens=scan.min_kv_to_fit - 1), cfg)
    assert not scan.still_holds(sched, replace(state, free_kv_tokens=scan.min_kv_to_fit), cfg)  # one fits
    assert not scan.still_holds(sched, replace(state, free_running_slots=state.free_running_slots + 1), cfg)
    assert not scan.still_holds(sched, replace(state, num_decoding=state.num_decoding + 1), cfg)
    assert not scan.still_holds(sched, state, cfg.model_copy(update={"lookahead": 3}))
    queue = sched.waiting_queue
    queue.append(h.req("holder"))  # an arrival
    assert not scan.still_holds(sched, state, cfg)
    queue.pop()
    queue[0], queue[1] = queue[1], queue[0]  # a reordering (sglang's cache-aware policies sort in place)
    assert not scan.still_holds(sched, state, cfg)
    queue[0], queue[1] = queue[1], queue[0]
    sched.waiting_queue = list(queue)  # the list sglang replaces after an admission
    assert not scan.still_holds(sched, state, cfg)
    sched.waiting_queue = queue
    assert scan.still_holds(sched, state, cfg)
    key = RadixKey(array("q", range(7, 20)))
    sched.tree_cache.insert(InsertParams(key=key, value=torch.arange(13)))  # the cache gained tokens
    assert not scan.still_holds(sched, state, cfg)


def test_the_short_stream_count_follows_the_running_requests():
    """A pass without an adder takes the scan's count of short decoding streams only while the very same requests
    run; a long document decoding in the holder's place (as many streams) is counted afresh, and the scan is
    stale."""
    h = DecodingHarness(POOL, blocked_queue(3))
    h.run(4)
    scan, state = idle_state(h)
    cfg = h.policy.cfg
    assert cfg.is_short(2000) and not cfg.is_short(3000)
    assert (state.num_decoding, state.num_short_decoding) == (1, 1)
    other = DecodingHarness(POOL, [ReqSpec("doc", 3000, max_new_tokens=1000, decode_passes=10_000)])
    other.run(3)
    h.running.reqs = [other.req("doc")]
    swapped = scan.state_without_adder(h.sched, h.running, cfg)
    assert (swapped.num_decoding, swapped.num_short_decoding) == (1, 0)
    assert not scan.still_holds(h.sched, swapped, cfg)


def test_strict_fcfs_reuses_too_and_upstream_keeps_its_batch_is_full():
    with mock.patch.dict(os.environ, {"FAIRSHARE_SKIP_AHEAD": "false"}):
        _, reusing = run_pair(POOL, blocked_queue(5), num_passes=8)
    assert reusing.running.batch_is_full


REQ = st.builds(
    lambda size, new, arrive, decode, prefix: (size, new, arrive, decode, prefix),
    st.one_of(st.integers(1, 64), st.integers(64, 1500), st.integers(1500, 6000)),
    st.integers(1, 600),
    st.integers(0, 8),
    st.integers(1, 40),
    st.one_of(st.none(), st.floats(0.1, 0.9)),
)


def build_reqs(raw: list[tuple]) -> list[ReqSpec]:
    reqs: list[ReqSpec] = []
    for i, (size, new, arrive, decode, prefix) in enumerate(raw):
        spec = ReqSpec(f"q{i}", size, max_new_tokens=new, arrive_pass=arrive, decode_passes=decode)
        if reqs and prefix is not None:  # shares a prefix with the previous request
            parent = reqs[-1]
            spec = ReqSpec(
                spec.rid,
                max(size, parent.prompt_tokens // 2 + 1),
                max_new_tokens=new,
                arrive_pass=arrive,
                decode_passes=decode,
                prefix_of=parent.rid,
                prefix_tokens=max(1, int(min(parent.prompt_tokens, size) * prefix) - 1),
            )
        reqs.append(spec)
    return reqs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pool=st.sampled_from([2048, 4096, 8192]),
    page=st.sampled_from([1, 1, 4, 16]),
    chunk=st.sampled_from([256, 512, 1024, None]),
    max_running=st.sampled_from([2, 4, 16]),
    mixed=st.booleans(),
    env=st.fixed_dictionaries(
        {
            "FAIRSHARE_SKIP_AHEAD": st.sampled_from(["true", "true", "false"]),
            "FAIRSHARE_LOOKAHEAD": st.sampled_from(["0", "2", "16"]),
            "FAIRSHARE_MAX_SKIPPED_PASSES": st.sampled_from(["1", "3", "256"]),
            "FAIRSHARE_SHORT_REQUEST_TOKENS": st.sampled_from(["64", "2048"]),
        }
    ),
    raw=st.lists(REQ, min_size=1, max_size=14),
)
def test_decisions_are_the_same_pass_by_pass(pool, page, chunk, max_running, mixed, env, raw):
    engine = EngineSpec(
        pool_tokens=pool,
        page_size=page,
        chunk_tokens=chunk,
        max_running=max_running,
        mixed_chunk=mixed,
        new_token_ratio=0.7,
    )
    with mock.patch.dict(os.environ, env):
        run_pair(engine, build_reqs(raw), num_passes=30)


def test_random_queues_do_reuse_scans():
    """The property above is not vacuous: on queues like its own, many passes plan on a reused scan."""
    reqs = build_reqs([(3000 + 7 * i, 300, i % 5, 20, None) for i in range(12)])
    _, reusing = run_pair(EngineSpec(pool_tokens=8192, chunk_tokens=1024, new_token_ratio=0.7), reqs, 40)
    assert reusing.policy.num_reused_scans >= 10
    assert reusing.kinds.count("repeat") >= 5


def test_a_pass_with_nothing_waiting_decides_and_keeps_what_the_whole_pass_boundary_would(monkeypatch):
    """`hooks.nothing_to_plan`: with no request waiting the plugin skips its pass boundary but for the short index's
    refresh. Against a twin that runs the whole boundary: the same passes, state across passes and index, through
    a queue emptied in place (an abort) with a short request indexed, and arrivals after it."""
    reqs = [
        *blocked_queue(2),
        ReqSpec("q-long-output", 30, max_new_tokens=3000, arrive_pass=1),  # short, indexed, never fits
        ReqSpec("q-late", 30, arrive_pass=8),
        ReqSpec("big-late", 2500, arrive_pass=9),
    ]
    whole, skipping = DecodingHarness(POOL, reqs), DecodingHarness(POOL, reqs)
    real, boundary_skipped = hooks.nothing_to_plan, []

    def counted(sched) -> bool:
        skipped = real(sched)
        boundary_skipped.append(skipped)
        return skipped

    def passes(h: DecodingHarness, n: int, skip: bool) -> list:
        with monkeypatch.context() as m:
            m.setattr(hooks, "nothing_to_plan", counted if skip else lambda sched: False)
            return h.run(n)

    assert passes(whole, 5, skip=False) == passes(skipping, 5, skip=True)
    assert [r.rid for r in skipping.policy.short_index.reqs] == ["q-long-output"]
    for h in (whole, skipping):
        h.sched.waiting_queue.clear()  # aborted while waiting, removed from the same list
    assert passes(whole, 3, skip=False) == passes(skipping, 3, skip=True)
    assert skipping.policy.short_index.reqs == [] and sum(boundary_skipped) >= 3
    assert passes(whole, 6, skip=False) == passes(skipping, 6, skip=True)
    assert planner_state(skipping) == planner_state(whole)
    assert skipping.policy.num_planned_passes == whole.policy.num_planned_passes
    assert skipping.policy.short_index.version == whole.policy.short_index.version
    assert [r.rid for r in skipping.policy.short_index.reqs] == [r.rid for r in whole.policy.short_index.reqs]
