"""The API key check and its middleware, on a small ASGI app (no Serve)."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient
from pydantic import ValidationError

from serve_app.api.auth import ApiKeyMiddleware, AuthSettings, check_authorization, process_api_key
from serve_app.protocol.errors import OpenAIError

KEY = "sk-test-0123456789"


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

    api.add_middleware(ApiKeyMiddleware, expected_key=key)
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
        check_authorization(authorization, KEY.encode())
    assert e.value.status == 401 and message in e.value.message
    assert e.value.headers == {"WWW-Authenticate": "Bearer"}


def test_right_key_passes_and_no_key_means_open() -> None:
    check_authorization(f"Bearer {KEY}", KEY.encode())
    check_authorization(f"bearer   {KEY}", KEY.encode())
    check_authorization(None, None)


def test_compare_is_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    import serve_app.api.auth as auth

    real = auth.hmac.compare_digest
    monkeypatch.setattr(auth.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    with pytest.raises(OpenAIError):
        check_authorization("Bearer nope", KEY.encode())
    assert calls == [(b"nope", KEY.encode())]


def test_middleware_guards_every_route_but_health() -> None:
    client = app_with_key(KEY.encode())
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
    monkeypatch.delenv("FAIRSHARE_API_KEY_FILE", raising=False)
    monkeypatch.delenv("FAIRSHARE_API_KEY", raising=False)
    process_api_key.cache_clear()
    client = app_with_key(process_api_key)
    monkeypatch.setenv("FAIRSHARE_API_KEY", KEY)
    try:
        assert client.post("/v1/chat/completions").status_code == 401
        assert client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    finally:
        process_api_key.cache_clear()


def test_settings_from_env_and_secret_file(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv("FAIRSHARE_API_KEY", raising=False)
    monkeypatch.delenv("FAIRSHARE_API_KEY_FILE", raising=False)
    assert AuthSettings().expected_key is None
    monkeypatch.setenv("FAIRSHARE_API_KEY", KEY)
    assert AuthSettings().expected_key == KEY.encode()
    assert KEY not in repr(AuthSettings())  # a SecretStr: never printed

    monkeypatch.delenv("FAIRSHARE_API_KEY")
    secret = tmp_path / "api-key"
    secret.write_text(KEY + "\n")  # as `kubectl create secret --from-file` stores it
    monkeypatch.setenv("FAIRSHARE_API_KEY_FILE", str(secret))
    assert AuthSettings().expected_key == KEY.encode()


def test_settings_errors_name_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("FAIRSHARE_API_KEY", KEY)
    monkeypatch.setenv("FAIRSHARE_API_KEY_FILE", str(tmp_path / "k"))
    with pytest.raises(ValidationError, match="not both"):
        AuthSettings()
    monkeypatch.delenv("FAIRSHARE_API_KEY")
    with pytest.raises(ValidationError, match="no such file"):
        AuthSettings()
    (tmp_path / "k").write_text("\n")
    with pytest.raises(ValidationError, match="is empty"):
        AuthSettings()
