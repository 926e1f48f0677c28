"""Whom a request is billed to: its tenant, with the weight and the limit that come with it.

A request's tenant is, first that applies: the tenant of the API key it was authenticated with (the key table,
`key_table`; the auth middleware leaves it in the request's scope, so a client with a key cannot claim another
tenant), the `X-Tenant` header, the OpenAI body's `user` field, `DEFAULT_TENANT`. A name is 1 to 64 characters of
`[A-Za-z0-9._-]` (`TENANT_NAME`): it labels metrics and is echoed in the `X-Tenant` response header. A header with any
other is a 400 naming it; a `user` that is not a name (OpenAI clients put end-user ids there, emails among them)
names the tenant ``user-`` and a digest of it (`user_tenant`): each such user is still a tenant of its own.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.types import Scope

from scheduler.tenants import DEFAULT_TENANT
from serve_app.api.asgi import header
from serve_app.protocol.errors import OpenAIError

TENANT_HEADER = "X-Tenant"
TENANT_NAME = r"[A-Za-z0-9._-]{1,64}"
"""What a tenant name is: header-safe, short, and a fair Prometheus label value."""
AUTHENTICATED_TENANT = "fairshare.tenant"
"""Where the auth middleware leaves the tenant of the key a request presented, in its ASGI scope."""

_NAME = re.compile(TENANT_NAME)


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str = DEFAULT_TENANT
    weight: float | None = None
    """The tenant's share of the engine relative to others; None: the engine policy's own weight for it, else 1."""
    max_queued_prefill_tokens: int | None = None
    """Its own limit on prompt tokens queued at the router; None: `RoutingKnobs.tenant_max_queued_prefill_tokens`."""


def is_tenant_name(value: str) -> bool:
    return _NAME.fullmatch(value) is not None


def tenant_name(value: str, param: str) -> str:
    """`value` if it is a tenant name, else a 400 naming `param` (its value is not echoed: it may be anything)."""
    if not is_tenant_name(value):
        raise OpenAIError(
            400,
            f"{param} names the tenant: 1 to 64 characters of letters, digits, '.', '_' or '-' "
            f"(got {len(value)} characters).",
            param=param,
            code="invalid_tenant",
        )
    return value


def user_tenant(user: str) -> str:
    """The tenant a `user` field names: itself when it is a tenant name, else ``user-`` and 12 hex digits of its
    digest (stable, and no user id in a metric label or a header)."""
    if is_tenant_name(user):
        return user
    return "user-" + hashlib.blake2b(user.encode(), digest_size=6).hexdigest()


def request_tenant(scope: Scope, body: Mapping[str, Any]) -> Tenant:
    """The request's tenant: its key's, else the header's, else `user`'s, else the default tenant."""
    authenticated = scope.get(AUTHENTICATED_TENANT)
    if isinstance(authenticated, Tenant):
        return authenticated
    claimed = header(scope, TENANT_HEADER)
    if claimed is not None:
        return Tenant(tenant_name(claimed, TENANT_HEADER))
    user = body.get("user")
    # A `user` that is not a string is the engine's to refuse: it names no tenant.
    if isinstance(user, str) and user:
        return Tenant(user_tenant(user))
    return Tenant()
