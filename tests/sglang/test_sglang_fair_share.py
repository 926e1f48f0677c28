"""Fair-share chunking on sglang's real adder: caps for the continuing request and for a new request being
cut, the full budget when uncontended, alignment, and never a second half-prefilled request."""

import random

import pytest

from harness.sglang_classes import EngineSpec, Harness, ReqSpec, make_req
from scheduler.sglang_plugin.adder import PassRun, Route, fair_share_adder_class
from scheduler.snapshot import Grant

ENGINE = EngineSpec(pool_tokens=65_536, chunk_tokens=2048, max_running=16)


@pytest.fixture
def cap_256(monkeypatch):
    monkeypatch.setenv("FAIRSHARE_PER_REQUEST_CAP_TOKENS", "256")
    monkeypatch.setenv("FAIRSHARE_ADAPTIVE_PASS", "false")
    # Shares alone: every pass a prefill pass, no slots or KV held back (those have their own tests).
    monkeypatch.setenv("FAIRSHARE_SHORT_DECODE_INTERLEAVE", "false")
    monkeypatch.setenv("FAIRSHARE_INTERACTIVE_RESERVE", "false")


def test_alone_a_long_request_gets_the_whole_budget(cap_256):
    plugin = Harness(ENGINE, [ReqSpec("doc", 9000)])
    plugin.run(5)
    assert [r.admitted for r in plugin.history[:4]] == [[("doc", 2048)]] * 4
    assert plugin.history[4].admitted == [("doc", 9000 - 4 * 2048)]


def test_default_policy_uncontended_uses_the_chunk_budget():
    """Adaptive passes on, no short traffic: quiet passes are sglang's whole chunk."""
    plugin = Harness(ENGINE, [ReqSpec("doc", 9000)])
    plugin.run(2)
    assert [r.admitted for r in plugin.history] == [[("doc", 2048)]] * 2


def test_continuing_request_is_capped_when_a_short_one_shares_the_pass(cap_256):
    plugin = Harness(ENGINE, [ReqSpec("doc", 9000), ReqSpec("question", 30, arrive_pass=1)])
    plugin.run(3)
    assert plugin.history[1].admitted == [("doc", 256), ("question", 30)]
    assert plugin.sched.chunked_req.rid == "doc"
    assert plugin.history[2].admitted == [("doc", 2048)]  # alone again: the whole budget


def test_new_request_being_cut_gets_its_share(cap_256):
    plugin = Harness(ENGINE, [ReqSpec("question", 30), ReqSpec("doc", 9000)])
    record = plugin.step()
    assert record.admitted == [("question", 30), ("doc", 256)]
    assert record.chunked == "doc"
    assert plugin.policy.last_run.plan.grants == [Grant("question", 30, False), Grant("doc", 256, True)]


def test_uncontended_f_is_derived_from_sglangs_concurrency_limit(monkeypatch):
    monkeypatch.setenv("FAIRSHARE_ADAPTIVE_PASS", "false")
    engine = EngineSpec(pool_tokens=65_536, chunk_tokens=8192, max_running=10)
    plugin = Harness(engine, [ReqSpec("question", 30), ReqSpec("doc", 20_000)])
    assert plugin.policy.cfg.cap_tokens == 409  # N = 2 * 10, F = 8192 / 20
    assert plugin.step().admitted == [("question", 30), ("doc", 409)]


@pytest.mark.parametrize(("page_size", "truncation_align", "granule"), [(16, None, 16), (16, 64, 64), (4, None, 4)])
def test_cuts_respect_page_and_truncation_alignment(cap_256, monkeypatch, page_size, truncation_align, granule):
    monkeypatch.setenv("FAIRSHARE_PER_REQUEST_CAP_TOKENS", "200")  # not a multiple of the granule
    engine = EngineSpec(
        pool_tokens=65_536, page_size=page_size, chunk_tokens=2048, truncation_align_size=truncation_align
    )
    reqs = [ReqSpec("q0", 30), ReqSpec("doc", 9000)] + [ReqSpec(f"q{i}", 30, arrive_pass=i) for i in range(1, 6)]
    plugin = Harness(engine, reqs)
    plugin.run(7)
    cuts = [n for record in plugin.history for rid, n in record.admitted if rid == "doc"]
    assert cuts[:6] == [200 // granule * granule] * 6
    doc = plugin.req("doc")
    assert doc.prefix_len % granule == 0
    assert plugin.policy.last_run.snapshot.granule_tokens == granule


def test_never_two_half_prefilled_requests(cap_256):
    """Long documents arrive while one is being cut; shares never create a second cut request (sglang
    would assert `self.chunked_req is None`), and every pass has at most one request left unfinished."""
    rng = random.Random(4)
    reqs = [ReqSpec(f"d{i}", rng.randint(1500, 6000), arrive_pass=rng.randint(0, 8)) for i in range(6)]
    reqs += [ReqSpec(f"q{i}", rng.randint(5, 200), arrive_pass=rng.randint(0, 20)) for i in range(12)]
    plugin = Harness(EngineSpec(pool_tokens=65_536, chunk_tokens=1024, max_running=32, req_rows=64), reqs)
    for _ in range(60):
        record = plugin.step()
        unfinished = [
            rid for rid, _ in record.admitted if plugin.req(rid).extend_end < len(plugin.req(rid).origin_input_ids)
        ]
        assert len(unfinished) <= 1
        assert unfinished == ([record.chunked] if record.chunked else [])
    assert not plugin.sched.waiting_queue and plugin.sched.chunked_req is None


class _ForcedRun:
    """A pass that admits every request whole, to see the adder's own invariant check act alone."""

    skip_ahead = False
    exhausted = False
    continuing_cut = True

    def bind(self, adder):
        self.adder = adder

    def route(self, req):
        return Route.ADMIT

    def grant(self, rid):
        return Grant(rid, 10**6, cut=False)


def test_adder_refuses_a_second_cut_request():
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

    from harness.sglang_classes import build_scheduler

    sched = build_scheduler(ENGINE, patched=False)
    adder = fair_share_adder_class(PrefillAdder)(
        1,
        sched.tree_cache,
        sched.token_to_kv_pool_allocator,
        ScheduleBatch(reqs=[]),
        0.5,
        16384,
        512,
        fairshare_run=_ForcedRun(),
    )
    spec = ReqSpec("long", 3000)
    req = make_req(spec, {"long": spec})
    req.init_next_round_input(sched.tree_cache)
    assert adder.add_one_req(req, has_chunked_req=True, truncation_align_size=None) is AddReqResult.OTHER
    assert adder.can_run_list == [] and adder.new_chunked_req is None
    # Without a chunked request the same request is cut as usual.
    assert adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None) is not AddReqResult.CONTINUE
    assert adder.new_chunked_req is req


def test_pass_run_is_per_scheduler_and_keeps_the_planner(cap_256):
    plugin = Harness(ENGINE, [ReqSpec("doc", 9000)])
    planner = plugin.policy.planner
    plugin.run(2)
    assert plugin.policy.planner is planner
    assert isinstance(plugin.policy.last_run, PassRun)


def test_a_request_admitted_beside_a_continuing_one_leaves_its_remaining_chunks_room(monkeypatch):
    # Found by the idle-scan property: a pass shared between a half-prefilled document and a request whose cached
    # prefix was evictable. Counting only the document's next chunk, and the prefix as free, the plan admitted
    # the request; its lock took the prefix from the pool and the document's last chunk found no KV (sglang:
    # "Prefill out of memory"). The document's whole remainder is claimed, and a match's lock is part of a need.
    monkeypatch.setenv("FAIRSHARE_SHORT_REQUEST_TOKENS", "2048")
    monkeypatch.setenv("FAIRSHARE_LOOKAHEAD", "0")
    monkeypatch.setenv("FAIRSHARE_MAX_SKIPPED_PASSES", "1")
    engine = EngineSpec(pool_tokens=2048, page_size=4, chunk_tokens=256, max_running=2)
    reqs = [
        ReqSpec("tiny", 1),
        ReqSpec("cached", 402),
        ReqSpec("doc", 1497, arrive_pass=1),
        ReqSpec("shares-prefix", 549, arrive_pass=1, decode_passes=11, prefix_of="cached", prefix_tokens=300),
    ]
    plugin = Harness(engine, reqs)
    plugin.run(30)  # raised RuntimeError (sglang's allocator) at pass 15 before
    admitted = [rid for r in plugin.history for rid, _ in r.admitted]
    assert set(admitted) == {"tiny", "cached", "doc", "shares-prefix"}
    doc_passes = [i for i, r in enumerate(plugin.history) if any(rid == "doc" for rid, _ in r.admitted)]
    joined = next(i for i, r in enumerate(plugin.history) if any(rid == "shares-prefix" for rid, _ in r.admitted))
    assert joined > doc_passes[-1], "no room beside the document until its last chunk"
