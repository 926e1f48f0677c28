"""Per-tenant metrics: the one cap on the `tenant` label every such series goes through, the tokens served read
from each response's `usage`, the sheds by tenant, and the queued tokens each engine replica publishes by tenant."""

from __future__ import annotations

import asyncio
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.api import relay
from serve_app.api.endpoints import CHAT
from serve_app.api.routed_call import RoutedCall
from serve_app.metrics import OTHER_TENANTS, EngineMetrics, ServedTokens, TenantLabels
from serve_app.protocol.sse import sse, usage_in
from serve_app.replica.backend import JSON, SSE, ResponseBody, ResponseStart
from serve_app.replica.engine_replica import queued_by_tenant
from tests.hypothesis_budget import examples
from tests.serve.test_engine_replica import FakeCounter, FakeMetrics, FakeStream


class FakeGauge:
    def __init__(self) -> None:
        self.values: dict[tuple, float] = {}

    def set(self, value: float, tags: dict | None = None) -> None:
        self.values[tuple(sorted((tags or {}).items()))] = value


def by_tenant(counter: FakeCounter, **where: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, n in counter.counts.items():
        tags = dict(key)
        if all(tags.get(k) == v for k, v in where.items()):
            out[tags["tenant"]] = out.get(tags["tenant"], 0) + n
    return out


# -- the cap ---------------------------------------------------------------------------------------------------


@settings(max_examples=examples(200))
@given(names=st.lists(st.sampled_from([f"t{i}" for i in range(12)]), max_size=40), cap=st.integers(1, 8))
def test_the_first_tenants_keep_their_names_and_later_ones_are_other(names: list[str], cap: int) -> None:
    labels = TenantLabels(cap)
    first_seen = list(dict.fromkeys(names))
    got = [labels(n) for n in names]
    assert got == [n if n in first_seen[:cap] else OTHER_TENANTS for n in names]
    assert len(set(got)) <= cap + 1  # however many tenants come, at most cap + 1 series per metric


def test_every_per_tenant_metric_of_the_ingress_goes_through_one_cap() -> None:
    m = FakeMetrics()
    m.tenant_label = TenantLabels(2)
    for tenant in ("acme", "beta", "gamma", "delta", "acme"):
        m.count_shed("router-tenant-queued-prefill-tokens", tenant)
        m.count_served(tenant, 10, 3)
    assert by_tenant(m.shed) == {"acme": 2, "beta": 1, OTHER_TENANTS: 2}
    assert by_tenant(m.tenant_tokens, kind="prompt") == {"acme": 20, "beta": 10, OTHER_TENANTS: 20}
    assert by_tenant(m.tenant_tokens, kind="completion") == {"acme": 6, "beta": 3, OTHER_TENANTS: 6}


def test_engine_replicas_publish_queued_tokens_by_tenant_and_zero_a_tenant_gone() -> None:
    metrics = EngineMetrics(TenantLabels(2))
    metrics.tenant_queued = gauge = FakeGauge()
    tenants = {"q1": "acme", "q2": "acme", "q3": "beta", "q4": "gamma"}
    pending = {"q1": 100, "q2": 50, "q3": 7, "q4": 1, "q5": 2}  # q5: a request of no known tenant
    queued = queued_by_tenant(pending, tenants)
    assert queued == {"acme": 150, "beta": 7, "gamma": 1, "default": 2}
    metrics.publish_tenants("both", queued)
    assert {dict(k)["tenant"]: v for k, v in gauge.values.items()} == {"acme": 150, "beta": 7, OTHER_TENANTS: 3}
    metrics.publish_tenants("both", {"beta": 5})
    assert {dict(k)["tenant"]: v for k, v in gauge.values.items()} == {"acme": 0, "beta": 5, OTHER_TENANTS: 0}


# -- tokens served, from `usage` -------------------------------------------------------------------------------

USAGE = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}


def chunk(content: str | None, usage: dict | None = None) -> str:
    delta = {} if content is None else {"content": content}
    return sse({"id": "c", "choices": [{"index": 0, "delta": delta}] if content is not None else [], "usage": usage})


def test_usage_is_read_from_a_whole_response_or_the_last_event_that_carries_one() -> None:
    whole = json.dumps({"id": "c", "choices": [], "usage": USAGE}).encode()
    assert usage_in(whole) == (12, 5)
    stream = (chunk("a") + chunk("b") + chunk(None, USAGE) + "data: [DONE]\n\n").encode()
    assert usage_in(stream) == (12, 5)
    # Usage in every event (the total so far): the last one counts.
    running = (chunk("a", {**USAGE, "completion_tokens": 1}) + chunk("b", USAGE)).encode()
    assert usage_in(running) == (12, 5)


def test_no_usage_is_read_where_there_is_none() -> None:
    assert usage_in((chunk("a") + "data: [DONE]\n\n").encode()) is None  # `"usage":null`
    assert usage_in(chunk('the "usage":{"prompt_tokens": 9} of it').encode()) is None  # text quoting one
    assert usage_in(b'{"error": {"message": "no"}}') is None
    assert usage_in(b'data: {"usage":{"prompt_tokens":') is None  # cut short: unreadable


def test_a_stream_counts_its_tenants_tokens_once_when_it_ends() -> None:
    m = FakeMetrics()
    first = [ResponseStart(200, SSE), ResponseBody((chunk("a", {**USAGE, "completion_tokens": 1})).encode())]
    rest = [[ResponseBody((chunk("b", USAGE) + "data: [DONE]\n\n").encode())]]

    async def relayed() -> None:
        async for _ in relay.relay(FakeStream(rest), first, RoutedCall(None, 0.0, "acme"), CHAT, m):
            pass

    asyncio.run(relayed())
    assert by_tenant(m.tenant_tokens, kind="prompt") == {"acme": 12}
    assert by_tenant(m.tenant_tokens, kind="completion") == {"acme": 5}


def test_a_whole_response_counts_its_tenants_tokens() -> None:
    m = FakeMetrics()
    body = json.dumps({"id": "c", "choices": [], "usage": USAGE}).encode()
    first = [ResponseStart(200, JSON), ResponseBody(body)]
    call = RoutedCall(None, 0.0, "beta")
    assert asyncio.run(relay.whole_body(FakeStream([]), first, call, CHAT, m, timed=True)) == body
    assert by_tenant(m.tenant_tokens) == {"beta": 17}


def test_a_response_counts_nothing_without_usage() -> None:
    m = FakeMetrics()
    served = ServedTokens(m, "acme")
    served.seen(chunk("a").encode())
    served.count()
    assert m.tenant_tokens.counts == {}
