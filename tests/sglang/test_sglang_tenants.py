"""Tenants on sglang's real scan: the plugin reads each request's tenant from its routing key, walks the queue in
virtual-token-counter order, and bills the tenants the tokens their requests decode; without keys every decision is
the per-request one. The Serve app's side: the routing key it hands sglang's serving classes."""

from types import SimpleNamespace

import pytest
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from harness.sglang_classes import EngineSpec, Harness, ReqSpec, make_req
from scheduler.sglang_plugin import attach, hooks
from scheduler.sglang_plugin.tenant_keys import QueueTenants
from scheduler.tenants import DEFAULT_TENANT, tenant_key
from serve_app.engines.sglang.openai_serving import DisconnectableRequest, routing_key

ENGINE = EngineSpec(pool_tokens=16384, chunk_tokens=512, max_running=16)
DOC_TOKENS = 2048
"""Four chunks: the team's documents arrive while the flood's first is still in prefill."""


def flood_and_team(keys: bool = True, num_team: int = 1) -> list[ReqSpec]:
    flood, team = (tenant_key("flood"), tenant_key("team")) if keys else (None, None)
    reqs = [ReqSpec(f"f{i}", DOC_TOKENS, routing_key=flood) for i in range(4)]
    return reqs + [ReqSpec(f"t{i}", DOC_TOKENS, arrive_pass=1, routing_key=team) for i in range(num_team)]


def start_order(harness: Harness) -> list[str]:
    """The requests in the order of their first chunk."""
    return list(dict.fromkeys(rid for record in harness.history for rid, _ in record.admitted))


def test_the_least_served_tenants_next_document_starts_first():
    harness = Harness(ENGINE, flood_and_team(num_team=2))
    harness.run(40)
    # The team's first document goes right after the flood's first, and then the tenants take turns: each next
    # document is the one of the tenant served least (sglang keeps one document in prefill at a time).
    assert start_order(harness) == ["f0", "t0", "f1", "t1", "f2", "f3"]
    tenants = harness.policy.planner.tenants
    assert tenants.backlogged == frozenset() and tenants.counters == {}  # all served: no counter kept


def test_a_pass_matches_only_the_requests_its_walk_reaches():
    reqs = [ReqSpec(f"t{i}", DOC_TOKENS, routing_key=tenant_key("team")) for i in range(2)]
    reqs += [ReqSpec(f"f{i}", DOC_TOKENS, arrive_pass=1, routing_key=tenant_key("flood")) for i in range(20)]
    harness = Harness(EngineSpec(pool_tokens=65536, chunk_tokens=512, max_running=4), reqs)
    harness.run(2)  # the team's first document in prefill, its second and the flood's twenty waiting
    run = harness.policy.last_run
    assert run.snapshot.tenants == {"team", "flood"}
    # The walk judged a few requests (no running slot was left for more), and only the queue up to them was matched
    # against the prefix cache: not the whole queue, which grouping it by tenant reads.
    assert len(run.window.examined) < len(harness.sched.waiting_queue) // 2
    assert harness.req("f19").last_node is None


def test_without_routing_keys_or_with_tenants_off_every_decision_is_the_per_request_one(monkeypatch):
    without_keys = Harness(ENGINE, flood_and_team(keys=False))
    without_keys.run(30)
    monkeypatch.setenv("FAIRSHARE_TENANT_FAIRNESS", "false")
    tenants_off = Harness(ENGINE, flood_and_team())
    tenants_off.run(30)
    assert start_order(without_keys) == ["f0", "f1", "f2", "f3", "t0"]
    assert without_keys.history == tenants_off.history  # pass for pass: admissions, chunks, queue


def test_the_snapshot_names_the_tenants_waiting_or_half_prefilled():
    harness = Harness(ENGINE, [*flood_and_team(), ReqSpec("w0", DOC_TOKENS, routing_key=tenant_key("gold", 2.0))])
    harness.run(1)
    run = harness.policy.last_run
    assert run.snapshot.tenants == {"flood", "gold"}
    harness.run(1)  # the team's document arrived, the flood's first is half-prefilled
    run = harness.policy.last_run
    assert run.snapshot.tenants == {"flood", "team", "gold"}
    assert [c.rid for c in run.snapshot.continuing] == ["f0"] and run.snapshot.continuing[0].tenant == "flood"
    judged = {c.rid: (c.tenant, c.tenant_weight) for c in run.window.candidates}
    assert judged["w0"] == ("gold", 2.0) and judged["t0"] == ("team", None)
    plain = Harness(ENGINE, flood_and_team(keys=False))
    plain.run(2)
    assert plain.policy.last_run.snapshot.tenants == {DEFAULT_TENANT}


def queued(rid: str, tenant: str) -> Req:
    spec = ReqSpec(rid, 16, routing_key=tenant_key(tenant))
    return make_req(spec, {rid: spec})


def test_the_queues_tenants_follow_arrivals_aborts_and_admissions():
    sched = Harness(ENGINE, []).sched
    index = QueueTenants()
    team, flood = queued("t0", "team"), [queued("f0", "flood"), queued("f1", "flood")]
    assert index.read(sched) == frozenset()
    sched.waiting_queue.extend(flood)
    assert index.read(sched) == {"flood"}
    sched.waiting_queue.append(team)
    assert index.read(sched) == {"flood", "team"}
    sched.waiting_queue.remove(team)  # an abort, in place
    assert index.read(sched) == {"flood"}
    sched.waiting_queue = [flood[1]]  # sglang's queue after an admission: a new list
    sched.chunked_req = team
    assert index.read(sched) == {"flood", "team"}


def decode_batch(*reqs) -> SimpleNamespace:
    return SimpleNamespace(forward_mode=ForwardMode.DECODE, reqs=list(reqs), forward_iter=0)


def test_decoded_tokens_are_billed_while_two_tenants_wait_and_nothing_is_read_otherwise(monkeypatch):
    harness = Harness(ENGINE, flood_and_team())
    harness.run(1)  # the flood alone: one tenant backlogged
    monkeypatch.setattr(attach, "decoded_rows", lambda batch: pytest.fail("read with one tenant backlogged"))
    hooks.around_run_batch(lambda sched, batch: None, harness.sched, decode_batch(harness.req("f0")))
    monkeypatch.undo()
    harness.run(1)  # the team's document waits beside the flood's
    tenants = harness.policy.planner.tenants
    before = dict(tenants.counters)
    decoding = [harness.req("f1"), harness.req("f2"), harness.req("t0")]
    hooks.around_run_batch(lambda sched, batch: None, harness.sched, decode_batch(*decoding))
    assert tenants.counters == {"flood": before["flood"] + 2 * 2, "team": before["team"] + 2}  # VTC: 2 per token


def test_a_pass_with_nobody_waiting_ends_the_tenants_backlog():
    harness = Harness(ENGINE, flood_and_team())
    harness.run(2)
    assert harness.policy.planner.tenants.backlogged == {"flood", "team"}
    harness.sched.waiting_queue.clear()  # everyone aborted while the flood's first document was in prefill
    harness.sched.chunked_req = None
    harness.step()
    assert harness.policy.planner.tenants.backlogged == frozenset()


def test_the_serve_app_hands_sglang_the_tenant_as_its_routing_key():
    serving = object.__new__(OpenAIServingCompletion)  # sglang's own header read, without an engine
    raw = DisconnectableRequest("/v1/completions", key=routing_key("acme", 2.0))
    assert serving.extract_routing_key(raw.request) == "acme*2"
    raw = DisconnectableRequest("/v1/completions", key=routing_key("acme", None))
    assert serving.extract_routing_key(raw.request) == "acme"
    assert routing_key(DEFAULT_TENANT, None) is None  # what no key reads as: plain requests carry none
    assert serving.extract_routing_key(DisconnectableRequest("/v1/completions").request) is None
