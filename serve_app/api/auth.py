"""Optional API keys: `Authorization: Bearer <key>` on every route but health, each key naming its tenant.

The keys come from the environment, read once at start (`AuthSettings.key_table`), from one of:

- `FAIRSHARE_API_KEYS_FILE`: the key table (`tenants.key_table`: key -> tenant, weight, limit), a file; on Kubernetes a
  Secret mounted as a volume;
- `FAIRSHARE_API_KEY`: a single key (on Kubernetes, `env.valueFrom.secretKeyRef` of a Secret);
- `FAIRSHARE_API_KEY_FILE`: a file holding a single key (one trailing newline is dropped, as
  `kubectl create secret --from-file` keeps it).

A single key is the table with one entry, tenant `default`. None set: no key is required (the laptop default,
loopback only). More than one set is a config error, and every error names the variable, never a key.
A missing or wrong key is answered 401 with OpenAI's error body and `WWW-Authenticate: Bearer`; a right one
leaves its tenant in the request's scope (`tenants.tenancy.AUTHENTICATED_TENANT`), where the ingress reads it.
`ApiKeyMiddleware` is plain ASGI, so streaming responses pass through it untouched.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from pathlib import Path

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from starlette.types import ASGIApp, Receive, Scope, Send

from serve_app.api.asgi import header, send_error
from serve_app.config.config_model import ConfigError
from serve_app.protocol.errors import OpenAIError
from serve_app.tenants.key_table import KeyTable, load_key_file
from serve_app.tenants.tenancy import AUTHENTICATED_TENANT, Tenant

OPEN_PATHS = frozenset({"/health"})
"""Routes answered without a key: probes from the load balancer and Kubernetes."""
SOURCES = ("FAIRSHARE_API_KEYS_FILE", "FAIRSHARE_API_KEY", "FAIRSHARE_API_KEY_FILE")


class AuthSettings(BaseSettings):
    """The variables as they are set; `key_table` checks them (never pydantic's errors: they would print a key)."""

    model_config = SettingsConfigDict(env_prefix="FAIRSHARE_", extra="ignore", frozen=True, env_ignore_empty=True)

    api_keys_file: Path | None = None
    api_key: SecretStr | None = None
    api_key_file: Path | None = None

    def key_table(self) -> KeyTable | None:
        """The keys clients must send, or None when none is required; a `ConfigError` naming the variable."""
        values = (self.api_keys_file, self.api_key, self.api_key_file)
        given = [name for name, value in zip(SOURCES, values, strict=True) if value is not None]
        if len(given) > 1:
            raise ConfigError(f"set one of {', '.join(SOURCES)}, not {' and '.join(given)}")
        if self.api_keys_file is not None:
            return load_key_file(self.api_keys_file)
        if self.api_key is not None:
            return KeyTable.single(_nonempty("FAIRSHARE_API_KEY", self.api_key.get_secret_value()).encode())
        if self.api_key_file is not None:
            return KeyTable.single(_read_key_file(self.api_key_file).encode())
        return None


@functools.cache
def process_key_table() -> KeyTable | None:
    """The keys this process requires, read from its environment once. A function, not a value, so that
    an app object pickled in one process (Serve ships the ingress's FastAPI app) reads the replica's env."""
    return AuthSettings().key_table()


def _nonempty(variable: str, key: str) -> str:
    if not key:
        raise ConfigError(f"{variable} is empty")
    return key


def _read_key_file(path: Path) -> str:
    if not path.is_file():
        raise ConfigError(f"FAIRSHARE_API_KEY_FILE: no such file {str(path)!r}")
    text = path.read_text(encoding="utf-8")
    key = text.removesuffix("\n").removesuffix("\r")
    if not key:
        raise ConfigError(f"FAIRSHARE_API_KEY_FILE: {str(path)!r} is empty")
    return key


def auth_error(message: str) -> OpenAIError:
    """401 with OpenAI's error body and the scheme the client should use."""
    return OpenAIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def check_authorization(authorization: str | None, keys: KeyTable | None) -> Tenant | None:
    """The tenant of the key in `authorization` (`Bearer <key>`); None when no key is required; a 401
    `OpenAIError` when the key is missing or in no entry."""
    if keys is None:
        return None
    if not authorization:
        raise auth_error("Missing API key: send it as 'Authorization: Bearer <key>'.")
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        raise auth_error("Malformed Authorization header: expected 'Bearer <key>'.")
    tenant = keys.tenant_of(presented.strip().encode())
    if tenant is None:
        raise auth_error("Incorrect API key provided.")
    return tenant


class ApiKeyMiddleware:
    """Plain ASGI middleware: every HTTP route but `open_paths` needs a key of the table."""

    def __init__(
        self,
        app: ASGIApp,
        keys: KeyTable | Callable[[], KeyTable | None] | None,
        open_paths: Iterable[str] = OPEN_PATHS,
    ) -> None:
        self.app = app
        self._keys = keys
        self.open_paths = frozenset(open_paths)

    @property
    def keys(self) -> KeyTable | None:
        keys = self._keys
        return keys() if callable(keys) else keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        keys = self.keys
        if scope["type"] != "http" or keys is None or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        try:
            scope[AUTHENTICATED_TENANT] = check_authorization(header(scope, "authorization"), keys)
        except OpenAIError as e:
            await send_error(send, e)
            return
        await self.app(scope, receive, send)
