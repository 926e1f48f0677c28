"""The plugin admits in sglang exactly what the simulator's scheduler decides on the same queue snapshots.

Each pass the plugin plans, its snapshot (the requests the planner judged, free KV and slots, the
continuing request, the decoding streams) is rebuilt as a simulated engine and handed to the simulator's
`PolicyScheduler`, which keeps its own planner across the passes. The prefill tokens it decides must be
the ones sglang's real adder committed for the plugin (shared scenarios: the simulator's seed workloads,
scaled; page size 1, as in the simulator)."""

import pytest
from sglang_harness import Harness
from sglang_scenarios import SHARED_SCENARIOS

from scheduler.sim.request import Phase, SimRequest
from scheduler.sim.schedulers import PolicyScheduler
from scheduler.snapshot import QueueSnapshot

POLICIES = {
    "defaults": {},
    "fixed-passes": {"FAIRSHARE_ADAPTIVE_PASS": "false", "FAIRSHARE_PER_REQUEST_CAP_TOKENS": "256"},
    "skip-ahead-only": {"FAIRSHARE_FAIR_SHARE": "false", "FAIRSHARE_ADAPTIVE_PASS": "false"},
    "fcfs": {"FAIRSHARE_SKIP_AHEAD": "false", "FAIRSHARE_FAIR_SHARE": "false", "FAIRSHARE_ADAPTIVE_PASS": "false"},
}


class SnapshotEngine:
    """The part of `SimEngine` that `PolicyScheduler.plan_step` reads, rebuilt from one snapshot."""

    def __init__(self, snap: QueueSnapshot, judged, short_request_tokens: int) -> None:
        self.waiting = [SimRequest(c.rid, c.extend_tokens, c.need_tokens - c.extend_tokens, 0.0) for c in judged]
        self.running = [SimRequest(c.rid, c.extend_tokens, 1, 0.0, phase=Phase.PREFILLING) for c in snap.continuing]
        for i in range(snap.num_decoding):
            prompt = 1 if i < snap.num_short_decoding else short_request_tokens + 1
            self.running.append(SimRequest(f"decoding-{i}", prompt, 1, 0.0, phase=Phase.DECODING))
        self.free_kv_tokens = snap.free_kv_tokens
        self.free_running_slots = snap.free_running_slots
        self.num_passes = snap.pass_index
        self.waiting_short = []  # the plugin has no short-request index: both see the scan only

    def iter_decoding(self):
        return (r for r in self.running if r.phase is Phase.DECODING)


@pytest.mark.parametrize("policy", POLICIES, ids=str)
@pytest.mark.parametrize("make", SHARED_SCENARIOS, ids=lambda f: f.__name__)
def test_plugin_admits_what_the_simulator_decides(monkeypatch, make, policy):
    for name, value in POLICIES[policy].items():
        monkeypatch.setenv(name, value)
    scenario = make()
    plugin = Harness(scenario.engine, scenario.reqs)
    sim = PolicyScheduler(plugin.policy.cfg, max_cut_requests=1)
    num_planned = 0
    for _ in range(scenario.num_passes):
        before = plugin.policy.last_run
        record = plugin.step()
        run = plugin.policy.last_run
        if run is before:
            assert record.admitted == []  # sglang returned before planning (nothing to admit, or decode owed)
            sim.interleave.decode_due(len(plugin.running.reqs))  # the simulator's owed decode pass ran too
            continue
        num_planned += 1
        assert run.snapshot.granule_tokens == 1
        decided = sim.plan_step(
            SnapshotEngine(run.snapshot, run.window.candidates, plugin.policy.cfg.short_request_tokens)
        )
        assert dict(record.admitted) == decided.prefill, f"pass {len(plugin.history) - 1}"
    assert num_planned >= 3
