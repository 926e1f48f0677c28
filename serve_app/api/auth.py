"""Optional API key: `Authorization: Bearer <key>` on every route but health, compared in constant time.

The key comes from the environment, read once at start (`AuthSettings.from_env`):

- `FAIRSHARE_API_KEY`: the key itself (on Kubernetes, `env.valueFrom.secretKeyRef` of a Secret);
- `FAIRSHARE_API_KEY_FILE`: a file holding it (a Secret mounted as a volume; one trailing newline
  is dropped, as `kubectl create secret --from-file` keeps it).

Neither set: no key is required (the laptop default, loopback only). Both set is a config error.
A missing or wrong key is answered 401 with OpenAI's error body and `WWW-Authenticate: Bearer`.
`ApiKeyMiddleware` is plain ASGI, so streaming responses pass through it untouched.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Self

from pydantic import SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from starlette.types import ASGIApp, Receive, Scope, Send

from serve_app.api.asgi import header, send_error
from serve_app.protocol.errors import OpenAIError

OPEN_PATHS = frozenset({"/health"})
"""Routes answered without a key: probes from the load balancer and Kubernetes."""


class AuthSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FAIRSHARE_", extra="ignore", frozen=True, env_ignore_empty=True)

    api_key: SecretStr | None = None
    api_key_file: Path | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if self.api_key is not None and self.api_key_file is not None:
            raise ValueError("set FAIRSHARE_API_KEY or FAIRSHARE_API_KEY_FILE, not both")
        if self.api_key_file is not None:
            if not self.api_key_file.is_file():
                raise ValueError(f"FAIRSHARE_API_KEY_FILE: no such file {str(self.api_key_file)!r}")
            if not _read_key_file(self.api_key_file):
                raise ValueError(f"FAIRSHARE_API_KEY_FILE: {str(self.api_key_file)!r} is empty")
        if self.api_key is not None and not self.api_key.get_secret_value():
            raise ValueError("FAIRSHARE_API_KEY is empty")
        return self

    @property
    def expected_key(self) -> bytes | None:
        """The key clients must send, or None when none is required."""
        if self.api_key is not None:
            return self.api_key.get_secret_value().encode()
        if self.api_key_file is not None:
            return _read_key_file(self.api_key_file).encode()
        return None


@functools.cache
def process_api_key() -> bytes | None:
    """The key this process requires, read from its environment once. A function, not a value, so that
    an app object pickled in one process (Serve ships the ingress's FastAPI app) reads the replica's env."""
    return AuthSettings().expected_key


def _read_key_file(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return text.removesuffix("\n").removesuffix("\r")


def auth_error(message: str) -> OpenAIError:
    """401 with OpenAI's error body and the scheme the client should use."""
    return OpenAIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def check_authorization(authorization: str | None, expected_key: bytes | None) -> None:
    """Raise a 401 `OpenAIError` unless `authorization` is `Bearer <expected_key>` (or no key is required)."""
    if expected_key is None:
        return
    if not authorization:
        raise auth_error("Missing API key: send it as 'Authorization: Bearer <key>'.")
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        raise auth_error("Malformed Authorization header: expected 'Bearer <key>'.")
    # Constant time: how much of a guess matches must not show in the response time.
    if not hmac.compare_digest(presented.strip().encode(), expected_key):
        raise auth_error("Incorrect API key provided.")


class ApiKeyMiddleware:
    """Plain ASGI middleware: every HTTP route but `open_paths` needs the key."""

    def __init__(
        self,
        app: ASGIApp,
        expected_key: bytes | Callable[[], bytes | None] | None,
        open_paths: Iterable[str] = OPEN_PATHS,
    ) -> None:
        self.app = app
        self._expected_key = expected_key
        self.open_paths = frozenset(open_paths)

    @property
    def expected_key(self) -> bytes | None:
        key = self._expected_key
        return key() if callable(key) else key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        expected_key = self.expected_key
        if scope["type"] != "http" or expected_key is None or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        try:
            check_authorization(header(scope, "authorization"), expected_key)
        except OpenAIError as e:
            await send_error(send, e)
            return
        await self.app(scope, receive, send)
