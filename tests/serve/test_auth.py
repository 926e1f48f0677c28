"""The API key check and its middleware, on a small ASGI app (no Serve). The key table itself: test_key_table."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient

from serve_app.api.auth import ApiKeyMiddleware, AuthSettings, check_authorization, process_key_table
from serve_app.config import ConfigError
from serve_app.protocol.errors import OpenAIError
from serve_app.tenants.key_table import KeyTable
from serve_app.tenants.tenancy import Tenant

KEY = "sk-test-0123456789"
TABLE = KeyTable.single(KEY.encode())
KEY_VARIABLES = ("FAIRSHARE_API_KEYS_FILE", "FAIRSHARE_API_KEY", "FAIRSHARE_API_KEY_FILE")


@pytest.fixture(autouse=True)
def no_keys_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in KEY_VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def app_with_key(key) -> TestClient:
    api = FastAPI()

    @api.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @api.post("/v1/chat/completions")
    async def chat() -> dict[str, str]:
        return {"answer": "yes"}

    @api.get("/stream")
    async def stream() -> StreamingResponse:
        return StreamingResponse(iter(["data: 1\n\n", "data: [DONE]\n\n"]), media_type="text/event-stream")

    api.add_middleware(ApiKeyMiddleware, keys=key)
    return TestClient(api)


@pytest.mark.parametrize(
    ("authorization", "message"),
    [
        (None, "Missing API key"),
        ("", "Missing API key"),
        ("Basic abc", "Malformed Authorization"),
        ("Bearer ", "Malformed Authorization"),
        ("Bearer wrong", "Incorrect API key"),
        (f"Bearer {KEY}x", "Incorrect API key"),
        (f"Bearer {KEY[:-1]}", "Incorrect API key"),
    ],
)
def test_wrong_or_missing_key_is_401(authorization: str | None, message: str) -> None:
    with pytest.raises(OpenAIError) as e:
        check_authorization(authorization, TABLE)
    assert e.value.status == 401 and message in e.value.message
    assert e.value.headers == {"WWW-Authenticate": "Bearer"}


def test_right_key_passes_with_its_tenant_and_no_key_means_open() -> None:
    assert check_authorization(f"Bearer {KEY}", TABLE) == Tenant()  # a single key bills the default tenant
    assert check_authorization(f"bearer   {KEY}", TABLE) == Tenant()
    assert check_authorization(None, None) is None


def test_middleware_guards_every_route_but_health() -> None:
    client = app_with_key(TABLE)
    assert client.get("/health").status_code == 200
    r = client.post("/v1/chat/completions")
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["code"] == "invalid_api_key" and set(r.json()["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }
    assert client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}).json() == {"answer": "yes"}
    stream = client.get("/stream", headers={"Authorization": f"Bearer {KEY}"})
    assert stream.text == "data: 1\n\ndata: [DONE]\n\n"
    assert client.get("/stream").status_code == 401


def test_middleware_without_key_is_open() -> None:
    assert app_with_key(None).post("/v1/chat/completions").status_code == 200


def test_middleware_reads_the_key_where_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # The app is built (and pickled) in one process and served in another: the key is read when serving.
    process_key_table.cache_clear()
    client = app_with_key(process_key_table)
    monkeypatch.setenv("FAIRSHARE_API_KEY", KEY)
    try:
        assert client.post("/v1/chat/completions").status_code == 401
        assert client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    finally:
        process_key_table.cache_clear()


def single_key_tenant(table: KeyTable | None) -> Tenant | None:
    assert table is not None and len(table) == 1
    return table.tenant_of(KEY.encode())


def test_a_single_key_from_env_or_secret_file_is_a_table_of_one_default_tenant(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    assert AuthSettings().key_table() is None
    monkeypatch.setenv("FAIRSHARE_API_KEY", KEY)
    assert single_key_tenant(AuthSettings().key_table()) == Tenant("default")
    assert KEY not in repr(AuthSettings())  # a SecretStr: never printed

    monkeypatch.delenv("FAIRSHARE_API_KEY")
    secret = tmp_path / "api-key"
    secret.write_text(KEY + "\n")  # as `kubectl create secret --from-file` stores it
    monkeypatch.setenv("FAIRSHARE_API_KEY_FILE", str(secret))
    assert single_key_tenant(AuthSettings().key_table()) == Tenant("default")


def test_settings_errors_name_the_variable_and_never_the_key(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("FAIRSHARE_API_KEY", KEY)
    monkeypatch.setenv("FAIRSHARE_API_KEY_FILE", str(tmp_path / "k"))
    with pytest.raises(ConfigError, match="not FAIRSHARE_API_KEY and FAIRSHARE_API_KEY_FILE") as e:
        AuthSettings().key_table()
    assert KEY[:6] not in str(e.value)
    monkeypatch.setenv("FAIRSHARE_API_KEYS_FILE", str(tmp_path / "keys.yaml"))
    with pytest.raises(ConfigError, match="set one of FAIRSHARE_API_KEYS_FILE, FAIRSHARE_API_KEY, "):
        AuthSettings().key_table()
    monkeypatch.delenv("FAIRSHARE_API_KEY")
    monkeypatch.delenv("FAIRSHARE_API_KEYS_FILE")
    with pytest.raises(ConfigError, match="FAIRSHARE_API_KEY_FILE: no such file"):
        AuthSettings().key_table()
    (tmp_path / "k").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        AuthSettings().key_table()
