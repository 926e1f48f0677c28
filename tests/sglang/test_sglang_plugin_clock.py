"""``FAIRSHARE_PLUGIN_CLOCK``: the plugin's own time per pass, recorded in the scheduler process."""

from harness.sglang_classes import UPSTREAM_PREFILL_RAW, EngineSpec, Harness, ReqSpec, StandInScheduler
from scheduler.sglang_plugin import hooks
from scheduler.sglang_plugin.clock import PassKind, read_clock


class UpstreamClockedStandInScheduler(StandInScheduler):
    """The stand-in as a server with the plugin off and its clock on patches it (`hooks.UPSTREAM_CLOCK_TARGETS`)."""

    def _get_new_batch_prefill_raw(self, *args, **kwargs):
        return hooks.around_upstream_prefill_raw_clocked(UPSTREAM_PREFILL_RAW, self, *args, **kwargs)


def test_every_pass_boundary_is_recorded_and_planned_ones_are_marked(monkeypatch, tmp_path):
    path = tmp_path / "clock.jsonl"
    monkeypatch.setenv("FAIRSHARE_PLUGIN_CLOCK", str(path))
    reqs = [ReqSpec("holder", 2000, decode_passes=50), ReqSpec("big", 2500, arrive_pass=1)]
    plugin = Harness(EngineSpec(pool_tokens=4096, chunk_tokens=2048), reqs)
    plugin.run(6)
    plugin.policy.clock.flush()
    passes, next_line = read_clock(path)
    assert len(passes) == 6
    assert all(p.kind is not PassKind.NONE for p in passes)  # the queue is never empty after pass 0
    assert passes[0].kind is PassKind.SCAN
    assert all(0 < p.ns <= p.call_ns for p in passes)
    plugin.sched.waiting_queue.clear()  # sglang returns before building an adder: nothing is planned
    plugin.run(2)
    plugin.policy.clock.flush()
    more, _ = read_clock(path, next_line)
    assert [p.kind for p in more] == [PassKind.NONE, PassKind.NONE]
    assert all(p.call_ns > 0 for p in more)


def test_off_by_default():
    plugin = Harness(EngineSpec(), [ReqSpec("a", 10)])
    plugin.run(1)
    assert plugin.policy.clock is None


def test_with_the_plugin_off_the_clock_times_upstreams_call_and_changes_nothing(monkeypatch, tmp_path):
    path = tmp_path / "clock.jsonl"
    monkeypatch.setenv("FAIRSHARE_PLUGIN_CLOCK", str(path))
    reqs = [
        ReqSpec("holder", 2000, decode_passes=50),
        ReqSpec("big", 2500, arrive_pass=1),
        ReqSpec("q", 30, arrive_pass=2),
    ]
    engine = EngineSpec(pool_tokens=4096, chunk_tokens=2048)
    clocked = Harness(engine, reqs, patched=False, scheduler_cls=UpstreamClockedStandInScheduler)
    upstream = Harness(engine, reqs, patched=False)
    assert clocked.run(8) == upstream.run(8)
    assert upstream.history[3].waiting == ["big", "q"]  # the case the clock is for: upstream's early return
    clocked.sched.__dict__[hooks.UPSTREAM_CLOCK_ATTR].flush()
    passes, _ = read_clock(path)
    assert len(passes) == 8
    assert all(p.kind is PassKind.NONE and p.ns == 0 and p.call_ns > 0 for p in passes)


def test_work_outside_the_prefill_call_is_recorded_with_the_next_pass_boundary(tmp_path):
    from scheduler.sglang_plugin.clock import PluginClock

    clock = PluginClock(tmp_path / "clock.jsonl")
    clock.begin_call()
    clock.end_pass(PassKind.IDLE)  # a pass with no work outside the call before it
    assert clock.timed_outside(sum, [1, 2]) == 3  # where a pass's result lands, between two calls
    assert clock.timed_outside(max, [1, 2]) == 2
    clock.begin_call()
    assert clock.timed(min, [1, 2]) == 1
    clock.end_pass(PassKind.IDLE)
    clock.begin_call()
    clock.end_pass(PassKind.IDLE)
    clock.flush()
    first, second, third = read_clock(clock.path)[0]
    assert first.outside_ns == 0 and third.outside_ns == 0
    assert second.outside_ns > 0 and second.ns > 0  # each in its own field: the call's sections are not in outside
    assert second.call_ns >= second.ns


def test_an_older_clocks_lines_read_as_not_timing_outside_the_call(tmp_path):
    path = tmp_path / "clock.jsonl"
    path.write_text('{"ns": [5], "call_ns": [9], "kind": [3]}\n')
    (only,) = read_clock(path)[0]
    assert only.outside_ns is None and only.kind is PassKind.IDLE
