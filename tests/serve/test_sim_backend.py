"""The sim backend on its own event loop: real-time loop, prefix cache, stop, abort, live policy."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.config import AppConfig, ConfigError, EngineKnobs
from serve_app.engines.sim.generation import GenerateRequest
from serve_app.engines.sim.prefix_cache import BLOCK_TOKENS, PrefixCache
from serve_app.engines.sim.sim_backend import SimBackend
from serve_app.engines.sim.stop import StopMatcher
from serve_app.replica.backend import OpenAIRequest
from serve_app.replica.held_prefixes import BlockRemoved, BlockStored, HeldPrefixes
from serve_app.routing.prefix_pages import PAGE_TOKENS, page_hashes
from serve_app.tokenizer import ApproxTokenizer
from tests.hypothesis_budget import examples
from tests.serve.prefixes import token_ids

FAST = EngineKnobs(time_scale=0.0)
CARD12GB = AppConfig(sim={"preset": "card12gb-27b"})
"""The source article's card: passes of ~0.26 s, so a scaled-down clock still leaves a stream many passes."""


def req(rid: str, text: str, max_tokens: int = 4, session: str | None = None, **kw) -> GenerateRequest:
    return GenerateRequest(rid, text, ApproxTokenizer(4.0).text_ids(text), max_tokens, session_id=session, **kw)


async def collect(backend: SimBackend, request: GenerateRequest) -> list:
    return [c async for c in backend.generator.generate(request)]


def run(coro):
    return asyncio.run(coro)


def test_stream_shape_and_length_finish() -> None:
    async def go():
        b = SimBackend(CARD12GB, FAST)
        await b.start()
        chunks = await collect(b, req("r1", "hello " * 50, max_tokens=5))
        await b.shutdown()
        return chunks, b

    chunks, b = run(go())
    assert chunks[0].cached_tokens == 0 and all(c.cached_tokens is None for c in chunks[1:])
    assert [c.finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert chunks[-1].completion_tokens == sum(c.num_tokens for c in chunks) == 5
    assert "".join(c.text for c in chunks).split() == ["the", "quick", "answer", "is", "that"]
    assert b.engine.idle and b.engine.kv_used_tokens == 0


@settings(max_examples=examples(300), deadline=None)
@given(
    st.text(alphabet="ab é\n\u4e2d", max_size=80),
    st.text(alphabet="xy ü", max_size=40),
    st.sampled_from([4.0, 3.7, 1.0, 2.5]),
    st.data(),
)
def test_the_ids_of_a_text_extended_are_its_ids_but_the_last_and_the_rest_read_alone(
    text: str, more: str, chars_per_token: float, data: st.DataObject
) -> None:
    tok = ApproxTokenizer(chars_per_token)
    whole = tok.text_ids(text + more)
    assert tok.extended_ids(text, tok.text_ids(text), more).tolist() == whole.tolist()
    first = data.draw(st.integers(0, len(whole)))
    assert tok.text_ids(text + more, first=first).tolist() == whole[first:].tolist()


def test_natural_end_is_stop() -> None:
    cfg = AppConfig(sim={"preset": "card12gb-27b", "natural_output_tokens": 3})

    async def go():
        b = SimBackend(cfg, FAST)
        await b.start()
        return await collect(b, req("r1", "hi", max_tokens=50))

    end = run(go())[-1]
    assert (end.finish_reason, end.completion_tokens) == ("stop", 3)


def test_stop_sequence_ends_early_and_frees_kv() -> None:
    async def go():
        b = SimBackend(CARD12GB, FAST)
        await b.start()
        chunks = await collect(b, req("r1", "hi", max_tokens=50, stop=("answer",)))
        return chunks, b

    chunks, b = run(go())
    text = "".join(c.text for c in chunks)
    assert text == "the quick " and chunks[-1].finish_reason == "stop"
    assert b.engine.kv_used_tokens == 0 and b.engine.idle


def test_a_prompt_is_cached_for_the_next_request_that_starts_with_it_whoever_sends_it() -> None:
    async def go():
        b = SimBackend(CARD12GB, FAST)
        await b.start()
        first = "".join(f"line {i} of the document. " for i in range(400))
        out = await collect(b, req("r1", first, max_tokens=4, session="s"))
        answer = "".join(c.text for c in out)
        context = ApproxTokenizer(4.0).text_ids(first + answer)
        assert b.cache.holds(context) == len(context) // BLOCK_TOKENS * BLOCK_TOKENS  # prompt and answer, whole
        second = await collect(b, req("r2", first + answer + "next question", max_tokens=4, session="s"))
        other = await collect(b, req("r3", first + "another question", max_tokens=4))
        fresh = await collect(b, req("r4", "a different document " * 200, max_tokens=4))
        return first, second[0], other[0], fresh[0], b

    first, second, other, fresh, b = run(go())
    whole_blocks = len(ApproxTokenizer(4.0).text_ids(first)) // BLOCK_TOKENS * BLOCK_TOKENS
    assert second.cached_tokens >= whole_blocks  # the document and (the blocks of) its answer
    assert other.cached_tokens == whole_blocks  # by content: no session needed
    assert fresh.cached_tokens == 0
    # What the replica publishes for the router: the document's pages, replayed from the cache's KV events.
    published = set(b.held_prefixes(4096))
    assert set(page_hashes(ApproxTokenizer(4.0).text_ids(first))) <= published


def test_prefix_cache_is_bounded_evicts_leaves_first_and_records_what_it_does() -> None:
    cache = PrefixCache(max_tokens=1000)
    doc = token_ids("doc", 640)
    cache.store(doc)
    cache.store(token_ids("doc", 704))  # a follow-up: one block more on the same chain
    stored = cache.take_events()
    assert [type(e) for e in stored] == [BlockStored, BlockStored]
    assert stored[1].parent == stored[0].block_hashes[-1] and len(stored[1].block_hashes) == 704 // 16 - 640 // 16
    cache.store(token_ids("other", 640))  # over the bound: the least recently used leaves go first
    assert cache.total_tokens <= 1000
    evicted = [e for e in cache.take_events() if isinstance(e, BlockRemoved)]
    assert evicted and set(evicted[0].block_hashes) <= set(stored[1].block_hashes) | set(stored[0].block_hashes)
    assert cache.match(token_ids("other", 640)) == 640
    held_of_doc = cache.match(doc)
    assert held_of_doc % BLOCK_TOKENS == 0 and held_of_doc < 640  # what is left of it is a run from its start


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(1, 600), st.booleans()), min_size=1, max_size=30
    ),
    st.integers(64, 2000),
)
def test_the_replicas_published_pages_are_exactly_the_router_pages_the_sim_cache_holds(ops, max_tokens) -> None:
    cache, held = PrefixCache(max_tokens), HeldPrefixes()
    for name, tokens, is_store in ops:
        ids = token_ids(name, tokens)
        cache.store(ids) if is_store else cache.match(ids)
        assert cache.total_tokens <= max_tokens
        held.apply(cache.take_events())
        # Every prompt: the router pages of what the cache holds of it are published, and no page past it.
        published = set(held.published(10**6))
        for other in ("a", "b", "c", "d"):
            ids = token_ids(other, 600)
            pages = page_hashes(ids)
            expected = pages[: cache.holds(ids) // PAGE_TOKENS]
            assert set(expected) <= published
            assert not set(pages[len(expected) :]) & published


def test_the_passes_a_replica_runs_in_wall_time_are_its_costs_stated_error_and_none_without_a_clock() -> None:
    """Passes with prefill that ran in wall time are timed against their cost, and the planner is charged with what
    they show; a pass ends no earlier than its cost. With the clock scaled to 0 nothing runs in wall time."""

    async def go(time_scale: float) -> SimBackend:
        b = SimBackend(CARD12GB, EngineKnobs(time_scale=time_scale))
        await b.start()
        await asyncio.gather(*(collect(b, req(f"r{i}", f"document {i} " * 3000, max_tokens=2)) for i in range(4)))
        await b.shutdown()
        return b

    timed = run(go(0.05))
    overruns = list(timed.wall_cost.overruns.latest)
    assert timed.scheduler.planner.pass_cost is timed.wall_cost
    assert len(overruns) >= timed.wall_cost.overruns.min_count and min(overruns) > -0.01
    assert timed.wall_cost.relative_error == timed.wall_cost.overruns.stated >= 0
    untimed = run(go(0.0))
    assert not untimed.wall_cost.overruns.latest and untimed.wall_cost.relative_error == 0


def test_a_request_still_being_tokenized_is_in_the_load_its_replica_checks_limits_on() -> None:
    """A long prompt is tokenized off the event loop before the engine takes it: meanwhile another request's limit
    check must see it, or two documents each pass a queue that holds one."""
    release = threading.Event()

    async def go():
        b = SimBackend(CARD12GB, FAST)
        tokenize = b.serving.tokenizer.text_ids
        b.serving.tokenizer.text_ids = lambda text, **kw: release.wait(30) and tokenize(text, **kw)  # on its thread
        await b.start()
        body = {"model": b.model_id, "messages": [{"role": "user", "content": "word " * 40_000}], "max_tokens": 2}
        parts = b.respond(OpenAIRequest("chat", body, "doc", prompt_tokens=50_000))
        first = asyncio.ensure_future(anext(parts))
        for _ in range(500):
            await asyncio.sleep(0.01)
            if b.load().num_waiting:
                break
        tokenizing = b.load()
        release.set()
        await first
        await parts.aclose()
        gone = b.load()
        await b.shutdown()
        return tokenizing, gone

    tokenizing, gone = run(go())
    assert (tokenizing.num_waiting, tokenizing.prefill_tokens) == (1, 50_000)
    assert (gone.num_waiting, gone.num_prefilling, gone.prefill_tokens) == (0, 0, 0)


def test_cancelled_stream_aborts_in_the_engine() -> None:
    async def go():
        b = SimBackend(CARD12GB, EngineKnobs(time_scale=0.001))
        await b.start()
        gen = b.generator.generate(req("r1", "hello " * 100, max_tokens=5000))
        await gen.__anext__()
        await gen.__anext__()
        held = b.engine.kv_used_tokens
        await gen.aclose()
        return held, b

    held, b = run(go())
    assert held > 0
    assert b.engine.kv_used_tokens == 0 and b.engine.idle and b.counters().num_aborted == 1


def test_live_reconfigure_and_bad_policy_rejected() -> None:
    b = SimBackend(CARD12GB, FAST)
    b.reconfigure(EngineKnobs(time_scale=0.5, policy={"max_running_requests": 1, "skip_ahead": False}))
    assert b.scheduler.cfg.max_running_requests == 1 and not b.scheduler.cfg.skip_ahead
    assert b.time_scale == 0.5
    with pytest.raises(ConfigError, match="max_running_requests"):
        b.reconfigure(EngineKnobs(policy={"max_running_requests": 0}))
    assert b.scheduler.cfg.max_running_requests == 1  # the old policy stays in force


def test_max_running_requests_serialises_when_set_to_one() -> None:
    async def go():
        b = SimBackend(CARD12GB, EngineKnobs(time_scale=0.001, policy={"max_running_requests": 1}))
        await b.start()
        order: list[str] = []

        async def one(rid):
            async for c in b.generator.generate(req(rid, "hi " * 10, max_tokens=3)):
                order.append(f"{rid}:{'end' if c.finish_reason else 'token'}")

        await asyncio.gather(one("a"), one("b"))
        return order

    order = run(go())
    first_b = next(i for i, event in enumerate(order) if event.startswith("b:"))
    assert order.index("a:end") < first_b


def test_cancelled_while_queued_leaves_the_queue() -> None:
    async def go():
        b = SimBackend(CARD12GB, EngineKnobs(time_scale=0.001, policy={"max_running_requests": 1}))
        await b.start()
        first = b.generator.generate(req("a", "hello " * 100, max_tokens=5000))
        await first.__anext__()  # running, holding the only slot
        queued = b.generator.generate(req("b", "hello " * 100, max_tokens=10))
        task = asyncio.ensure_future(queued.__anext__())
        await asyncio.sleep(0.01)
        waiting = [r.rid for r in b.engine.waiting]
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await queued.aclose()
        after = [r.rid for r in b.engine.waiting]
        await first.aclose()
        return waiting, after, b

    waiting, after, b = run(go())
    assert waiting == ["b"] and after == []
    assert b.engine.idle and b.engine.kv_used_tokens == 0 and b.counters().num_aborted == 2


@settings(deadline=None, max_examples=500)
@given(
    text=st.text(alphabet="ab ", max_size=40),
    stops=st.lists(st.text(alphabet="ab ", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=6),
)
def test_stop_is_found_wherever_the_chunks_split_the_text(text: str, stops: list[str], cuts: list[int]) -> None:
    bounds = [0, *sorted({min(c, len(text)) for c in cuts}), len(text)]
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    matcher, sent = StopMatcher(tuple(stops)), ""
    for chunk in chunks:
        out, stopped = matcher.feed(chunk)
        sent += out
        if stopped:
            break
    else:
        sent += matcher.flush()
    assert sent == stopped_output(text, stops)


def stopped_output(text: str, stops: list[str]) -> str:
    """The reference: grow the output one character at a time and stop as soon as it ends with a stop sequence."""
    for end in range(1, len(text) + 1):
        for s in sorted(stops, key=len, reverse=True):
            if text[:end].endswith(s):
                return text[: end - len(s)]
    return text
