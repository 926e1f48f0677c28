"""The API key table: each key names the tenant it bills, with that tenant's weight and limit.

A file (`FAIRSHARE_API_KEYS_FILE`: on Kubernetes a Secret mounted as a volume), YAML or JSON (`.json`):

    keys:
      - key: sk-acme-...              # what the client sends as `Authorization: Bearer <key>`
        tenant: acme                  # [A-Za-z0-9._-]{1,64}
        weight: 2                     # optional, > 0; unset: the engine policy's weight for the tenant, else 1
        max_queued_prefill_tokens: 100000   # optional: this tenant's limit at the router
      - key: sk-beta-...
        tenant: beta

A tenant may have several keys (rotation), all with the same weight and limit. A single key
(`FAIRSHARE_API_KEY[_FILE]`) is the table with one entry, tenant `default` (`KeyTable.single`).

Keys are kept as SHA-256 digests and a presented key is compared with every entry's, in constant time
(`hmac.compare_digest` on equal-length digests, never stopping at a match), so the response time tells neither how
much of a guess matched nor which entry did. No message ever shows a key: a bad file is named with its entry's
index and field.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator

from serve_app.config.config_model import ConfigError, StrictConfig
from serve_app.tenants.tenancy import TENANT_NAME, Tenant


class KeyEntry(StrictConfig):
    key: SecretStr
    tenant: str = Field(pattern=f"^{TENANT_NAME}$")
    weight: float | None = Field(None, gt=0, allow_inf_nan=False)
    max_queued_prefill_tokens: int | None = Field(None, ge=1)

    @field_validator("key")
    @classmethod
    def _presentable(cls, key: SecretStr) -> SecretStr:
        value = key.get_secret_value()
        # The presented key is read from a header and stripped: any other key could never match.
        if not value or value != value.strip() or not value.isascii() or not value.isprintable():
            raise ValueError("a key is printable ASCII, not empty, without spaces around it")
        return key

    @property
    def as_tenant(self) -> Tenant:
        return Tenant(self.tenant, self.weight, self.max_queued_prefill_tokens)


class KeyFile(StrictConfig):
    """The key table file's content."""

    keys: list[KeyEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_entry_per_key_one_setting_per_tenant(self) -> Self:
        first_of_key: dict[bytes, int] = {}
        first_of_tenant: dict[str, int] = {}
        for i, entry in enumerate(self.keys):
            j = first_of_key.setdefault(_digest(entry.key.get_secret_value().encode()), i)
            if j != i:
                raise ValueError(f"keys[{i}] repeats the key of keys[{j}]: each key names one tenant")
            j = first_of_tenant.setdefault(entry.tenant, i)
            if self.keys[j].as_tenant != entry.as_tenant:
                raise ValueError(
                    f"keys[{i}] gives tenant {entry.tenant!r} another weight or max_queued_prefill_tokens than "
                    f"keys[{j}]: every key of a tenant carries the same"
                )
        return self


class KeyTable:
    """Key digests and the tenant each names."""

    def __init__(self, entries: Sequence[tuple[bytes, Tenant]]) -> None:
        self._entries = [(_digest(key), tenant) for key, tenant in entries]

    @classmethod
    def single(cls, key: bytes) -> KeyTable:
        """One key, billed to the default tenant: `FAIRSHARE_API_KEY` as it always was."""
        return cls([(key, Tenant())])

    @classmethod
    def of(cls, parsed: KeyFile) -> KeyTable:
        return cls([(e.key.get_secret_value().encode(), e.as_tenant) for e in parsed.keys])

    def __len__(self) -> int:
        return len(self._entries)

    def tenant_of(self, presented: bytes) -> Tenant | None:
        """The tenant of the entry whose key is `presented`, or None. Every entry is compared, whichever matches."""
        wanted = _digest(presented)
        found: Tenant | None = None
        for digest, tenant in self._entries:
            if hmac.compare_digest(wanted, digest):
                found = tenant
        return found


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def load_key_file(path: Path, variable: str = "FAIRSHARE_API_KEYS_FILE") -> KeyTable:
    """The key table in `path`; a `ConfigError` naming `variable`, the file and the bad entry otherwise."""
    where = f"{variable} {str(path)!r}"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it ({e.strerror or type(e).__name__})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    try:
        parsed = KeyFile.model_validate(_parse(text, json_file=path.suffix.lower() == ".json"))
    except ValueError as e:
        raise ConfigError(f"{where}: {_describe(e)}") from None
    return KeyTable.of(parsed)


def _parse(text: str, *, json_file: bool) -> Any:
    """The file's data. Parser errors say where, never quote the line: it may hold a key."""
    if json_file:
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ValueError(f"not valid YAML: {e.problem}{at}") from None
    except yaml.YAMLError:
        raise ValueError("not valid YAML") from None


SHOWN_FIELDS = frozenset({"tenant", "weight", "max_queued_prefill_tokens"})
"""Fields whose bad value a message may quote: any other (a key, a misspelt field) may hold a secret."""


def _describe(e: ValueError) -> str:
    """Each problem by entry and field, with the value it got where that cannot be a key."""
    if not isinstance(e, ValidationError):
        return str(e)
    parts = []
    for err in e.errors():
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
        # Our own checks' messages as written (pydantic prefixes them with "Value error, ").
        msg = str(err["ctx"]["error"]) if err["type"] == "value_error" else err["msg"]
        shown = err["loc"][-1:] in {(f,) for f in SHOWN_FIELDS} and err["type"] != "missing"
        parts.append((f"{loc}: " if loc else "") + msg + (f" (got {err.get('input')!r})" if shown else ""))
    return "; ".join(parts)
