"""A request's tenant: its key's (the key wins over anything the client claims), else `X-Tenant`, else `user`, else
the default tenant; a bad name is a 400 naming where it came from. On a small app behind the key middleware."""

from __future__ import annotations

import string

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.api.auth import ApiKeyMiddleware
from serve_app.api.routed_call import RoutedCall
from serve_app.protocol.errors import OpenAIError
from serve_app.tenants.key_table import KeyTable
from serve_app.tenants.tenancy import Tenant, is_tenant_name, request_tenant
from tests.hypothesis_budget import examples

ACME = Tenant("acme", 2.0, 50_000)
KEYS = KeyTable([(b"sk-acme", ACME), (b"sk-beta", Tenant("beta"))])


def client(keys: KeyTable | None) -> TestClient:
    api = FastAPI()

    @api.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError):
        return exc.response()

    @api.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        tenant = request_tenant(request.scope, await request.json())
        return {"name": tenant.name, "weight": tenant.weight, "limit": tenant.max_queued_prefill_tokens}

    api.add_middleware(ApiKeyMiddleware, keys=keys)
    return TestClient(api)


def tenant_of(c: TestClient, body: dict | None = None, **headers: str) -> dict:
    r = c.post("/v1/chat/completions", json=body or {}, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def test_without_keys_the_header_then_user_then_the_default_name_the_tenant() -> None:
    c = client(None)
    assert tenant_of(c, {"user": "u-1"}, **{"X-Tenant": "team.a"}) == {"name": "team.a", "weight": None, "limit": None}
    assert tenant_of(c, {"user": "u-1"})["name"] == "u-1"
    assert tenant_of(c, {"user": 7})["name"] == "default"  # not a string: the engine refuses it, no tenant named
    assert tenant_of(c)["name"] == "default"


def test_with_keys_the_keys_tenant_wins_over_header_and_user() -> None:
    c = client(KEYS)
    claimed = tenant_of(c, {"user": "beta"}, Authorization="Bearer sk-acme", **{"X-Tenant": "beta"})
    assert claimed == {"name": "acme", "weight": 2.0, "limit": 50_000}
    # A claim the key overrides is not even read: a malformed one is no 400.
    assert tenant_of(c, {"user": "no way!"}, Authorization="Bearer sk-beta", **{"X-Tenant": "x y"})["name"] == "beta"
    assert c.post("/v1/chat/completions", json={}, headers={"X-Tenant": "acme"}).status_code == 401


@pytest.mark.parametrize(
    ("headers", "body", "param"),
    [
        ({"X-Tenant": ""}, {}, "X-Tenant"),
        ({"X-Tenant": "a b"}, {}, "X-Tenant"),
        ({"X-Tenant": "t" * 65}, {}, "X-Tenant"),
        ({"X-Tenant": "acme/../beta"}, {}, "X-Tenant"),
        ({"X-Tenant": "bad!"}, {"user": "fine"}, "X-Tenant"),
    ],
)
def test_a_bad_name_is_a_400_naming_where_it_came_from(headers: dict, body: dict, param: str) -> None:
    r = client(None).post("/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, "invalid_tenant", "invalid_request_error")
    assert error["message"].startswith(f"{param} names the tenant: 1 to 64 characters")


def test_a_user_field_that_is_no_tenant_name_names_a_tenant_by_its_digest() -> None:
    """OpenAI clients put end-user ids in `user` (emails too): each is a tenant of its own, named without the id."""
    c = client(None)
    alice, bob = (tenant_of(c, {"user": f"{who}@example.com"})["name"] for who in ("alice", "bob"))
    assert alice == tenant_of(c, {"user": "alice@example.com"})["name"] != bob
    assert alice.startswith("user-") and "alice" not in alice and is_tenant_name(alice)
    assert tenant_of(c, {"user": ""})["name"] == "default"


ALLOWED = string.ascii_letters + string.digits + "._-"


@settings(max_examples=examples(200))
@given(name=st.text(ALLOWED, min_size=1, max_size=64), bad=st.characters().filter(lambda c: c not in ALLOWED))
def test_names_are_short_and_of_safe_characters(name: str, bad: str) -> None:
    assert is_tenant_name(name)
    assert not is_tenant_name(name + bad) and not is_tenant_name(bad + name)
    assert not is_tenant_name(name + "a" * (65 - len(name)))


def test_responses_echo_the_tenant() -> None:
    assert RoutedCall("s", 0.0, "acme").headers()["X-Tenant"] == "acme"
    assert RoutedCall(None, 0.0).headers()["X-Tenant"] == "default"
