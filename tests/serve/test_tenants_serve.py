"""Tenants end to end: an app with a key table of two tenants, real HTTP on 127.0.0.1.

Its own app (the module's fixture), since the key table is read from the ingress's environment at start: the
conftest's app, on the sim engine in real time (a 6000-token document takes ~4 s to prefill), with the key table in
the application's `runtime_env.env_vars` and a limit per tenant at the router (the knob for every tenant, the key
table's own for the flooding one). Asserted: each answer names its key's tenant, whatever the client claims; a flood
from one tenant over its limit is shed with 429s that name it, while every request of the other tenant is answered
200; the per-tenant metrics reach Ray's Prometheus endpoint.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml

from tests.serve.conftest import ServeHandle, deployment, serving
from tests.serve.test_serve_app import doc

pytestmark = pytest.mark.serve

KEYS = {"flood": "sk-flood-0123456789", "steady": "sk-steady-9876543210"}
FLOOD_LIMIT = 6_000
"""The flooding tenant's own limit (the key table's): one document at a time."""
STEADY_LIMIT = 40_000
"""Every other tenant's (the Ingress's knob): well above what the steady tenant sends."""
DOC_TOKENS = 6_000
BURST = 12
"""Requests `_flood_beside_steady` sends at once."""
METRICS_TIMEOUT_S = 90
"""Ray exports a metric within seconds of its first record."""


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeHandle]:
    keys_file = tmp_path_factory.mktemp("secret") / "keys.yaml"
    entries = [
        {"key": KEYS["flood"], "tenant": "flood", "weight": 1, "max_queued_prefill_tokens": FLOOD_LIMIT},
        {"key": KEYS["steady"], "tenant": "steady", "weight": 2},
    ]
    keys_file.write_text(yaml.safe_dump({"keys": entries}))

    def with_keys(cfg: dict) -> None:
        cfg["applications"][0]["runtime_env"]["env_vars"]["FAIRSHARE_API_KEYS_FILE"] = str(keys_file)
        deployment(cfg, "Engine")["user_config"]["time_scale"] = 1.0  # real time: a document stays queued a while
        deployment(cfg, "Ingress")["user_config"]["tenant_max_queued_prefill_tokens"] = STEADY_LIMIT
        # The burst's twelve requests wait in the handle while the router decides each; Serve's own queue (the
        # conftest's 4) must hold them, or on a loaded machine its 429 races the tenant limit this module tests.
        deployment(cfg, "Engine")["max_queued_requests"] = BURST

    with serving(with_keys) as handle:
        yield handle


def body(served: ServeHandle, content: str) -> dict:
    return {"model": served.model, "messages": [{"role": "user", "content": content}], "max_tokens": 4}


def auth(tenant: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}", **headers}


def test_each_answer_names_its_keys_tenant_whatever_the_client_claims(keyed: ServeHandle) -> None:
    url = f"{keyed.base_url}/v1/chat/completions"
    short = body(keyed, "Who am I billed as?")
    assert httpx.post(url, json=short, timeout=60).status_code == 401
    r = httpx.post(url, json=short, headers={"Authorization": "Bearer sk-nobody"}, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    for tenant in KEYS:
        claims_other = auth(tenant, **{"X-Tenant": "someone-else"})
        r = httpx.post(url, json={**short, "user": "also-someone-else"}, headers=claims_other, timeout=60)
        assert (r.status_code, r.headers["x-tenant"]) == (200, tenant)


def test_a_flood_is_shed_from_its_tenant_while_the_other_is_answered(keyed: ServeHandle) -> None:
    flood, steady = asyncio.run(_flood_beside_steady(keyed))
    assert all(r.headers["x-tenant"] == "steady" for r in steady)
    assert [r.status_code for r in steady] == [200] * len(steady), [r.text for r in steady if r.status_code != 200]
    assert all(r.headers["x-tenant"] == "flood" for r in flood)
    codes = sorted(r.status_code for r in flood)
    assert set(codes) == {200, 429}, codes  # the first is taken (nothing of its tenant queued), later ones shed
    for r in flood:
        if r.status_code == 429:
            error = r.json()["error"]
            assert error["code"] == "rate_limit_exceeded" and error["type"] == "rate_limit_exceeded"
            assert error["message"].startswith("tenant 'flood' has "), error["message"]
            assert f"over its limit of {FLOOD_LIMIT};" in error["message"]
            assert int(r.headers["retry-after"]) >= 1
    _until_exported(
        keyed,
        "ray_fairshare_shed_requests_total{",
        'reason="router-tenant-queued-prefill-tokens"',
        'tenant="flood"',
    )
    _until_exported(keyed, "ray_fairshare_tenant_tokens_total{", 'kind="prompt"', 'tenant="steady"')
    _until_exported(keyed, "ray_fairshare_engine_tenant_queued_prefill_tokens{", 'tenant="flood"')


async def _flood_beside_steady(served: ServeHandle) -> tuple[list[httpx.Response], list[httpx.Response]]:
    """Six documents of the flooding tenant at once, beside two documents and four chats of the steady one."""
    url = f"{served.base_url}/v1/chat/completions"

    def send(client: httpx.AsyncClient, tenant: str, content: str):
        return client.post(url, json=body(served, content), headers=auth(tenant))

    async with httpx.AsyncClient(timeout=120) as client:
        steady_docs = [send(client, "steady", doc(DOC_TOKENS, f"steady-{i}")) for i in range(2)]
        flood = [send(client, "flood", doc(DOC_TOKENS, f"flood-{i}")) for i in range(6)]
        chats = [send(client, "steady", f"A short question, number {i}.") for i in range(4)]
        answers = await asyncio.gather(*steady_docs, *flood, *chats)
    return list(answers[2:8]), [*answers[:2], *answers[8:]]


def _until_exported(served: ServeHandle, *parts: str) -> None:
    """Wait until a series whose line holds every one of `parts` is on Ray's Prometheus endpoint."""
    deadline = time.monotonic() + METRICS_TIMEOUT_S
    while True:
        text = httpx.get(served.metrics_url, timeout=10).text
        if any(all(p in line for p in parts) for line in text.splitlines()):
            return
        assert time.monotonic() < deadline, f"no series with {parts} in {METRICS_TIMEOUT_S} s"
        time.sleep(1)
