"""The API key table: its file (YAML or JSON), what it refuses (named by file and entry, never showing a key), the
single key still accepted, and the comparison that looks at every entry in constant time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import serve_app.tenants.key_table as key_table
from serve_app.api.auth import AuthSettings, check_authorization
from serve_app.config import ConfigError
from serve_app.tenants.key_table import KeyTable, load_key_file
from serve_app.tenants.tenancy import Tenant

ACME, BETA, ROTATED = "sk-acme-0123456789", "sk-beta-9876543210", "sk-acme-rotated-42"
ENTRIES = [
    {"key": ACME, "tenant": "acme", "weight": 2, "max_queued_prefill_tokens": 100_000},
    {"key": BETA, "tenant": "beta"},
    {"key": ROTATED, "tenant": "acme", "weight": 2.0, "max_queued_prefill_tokens": 100_000},
]
YAML_TABLE = f"""\
keys:
  - key: {ACME}
    tenant: acme
    weight: 2
    max_queued_prefill_tokens: 100000
  - key: {BETA}
    tenant: beta
  - key: {ROTATED}      # a second key of the same tenant, as when a key is rotated
    tenant: acme
    weight: 2.0
    max_queued_prefill_tokens: 100000
"""
SECRETS = (ACME, BETA, ROTATED)


def written(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refusal(path: Path) -> str:
    """The start-up error for the file at `path`: it names the variable and the file, never a key."""
    with pytest.raises(ConfigError) as e:
        load_key_file(path)
    message = str(e.value)
    assert message.startswith(f"FAIRSHARE_API_KEYS_FILE {str(path)!r}: "), message
    assert not any(secret in message for secret in SECRETS), message
    return message.split(": ", 1)[1]


@pytest.mark.parametrize(("name", "text"), [("keys.yaml", YAML_TABLE), ("keys.json", json.dumps({"keys": ENTRIES}))])
def test_the_table_reads_from_yaml_or_json(tmp_path: Path, name: str, text: str) -> None:
    table = load_key_file(written(tmp_path, name, text))
    assert len(table) == 3
    acme = Tenant("acme", 2.0, 100_000)
    assert table.tenant_of(ACME.encode()) == table.tenant_of(ROTATED.encode()) == acme
    assert table.tenant_of(BETA.encode()) == Tenant("beta")  # no weight: the engine policy's, else 1
    assert table.tenant_of(b"sk-nobody") is None


def test_the_table_is_read_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("FAIRSHARE_API_KEY", "FAIRSHARE_API_KEY_FILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("FAIRSHARE_API_KEYS_FILE", str(written(tmp_path, "keys.yaml", YAML_TABLE)))
    table = AuthSettings().key_table()
    assert check_authorization(f"Bearer {BETA}", table) == Tenant("beta")


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"key": ACME, "tenant": "a b"}, "keys[0].tenant: String should match pattern"),
        ({"key": ACME, "tenant": "t" * 65}, "keys[0].tenant: String should match pattern"),
        ({"key": ACME, "tenant": "acme", "weight": 0}, "keys[0].weight: Input should be greater than 0 (got 0)"),
        ({"key": ACME, "tenant": "acme", "weight": -1.5}, "keys[0].weight: Input should be greater than 0"),
        ({"key": ACME, "tenant": "acme", "max_queued_prefill_tokens": 0}, "keys[0].max_queued_prefill_tokens"),
        ({"tenant": "acme"}, "keys[0].key: Field required"),
        ({"key": ACME}, "keys[0].tenant: Field required"),
        ({"key": f" {ACME}", "tenant": "acme"}, "keys[0].key: a key is printable ASCII"),
        ({"key": "", "tenant": "acme"}, "keys[0].key: a key is printable ASCII"),
        # A misspelt field may hold a key: refused without its value.
        ({"key": ACME, "tenant": "acme", "api_key": BETA}, "keys[0].api_key: Extra inputs are not permitted"),
    ],
)
def test_a_bad_entry_is_refused_by_index_and_field(tmp_path: Path, entry: dict, problem: str) -> None:
    path = written(tmp_path, "keys.json", json.dumps({"keys": [{"key": BETA, "tenant": "beta"}, entry]}))
    assert refusal(path).startswith(problem.replace("keys[0]", "keys[1]"))


def test_a_repeated_key_is_refused(tmp_path: Path) -> None:
    entries = [{"key": ACME, "tenant": "acme"}, {"key": BETA, "tenant": "beta"}, {"key": ACME, "tenant": "beta"}]
    problem = refusal(written(tmp_path, "keys.json", json.dumps({"keys": entries})))
    assert problem == "keys[2] repeats the key of keys[0]: each key names one tenant"


def test_keys_of_one_tenant_carry_one_weight_and_limit(tmp_path: Path) -> None:
    entries = [{"key": ACME, "tenant": "acme", "weight": 2}, {"key": ROTATED, "tenant": "acme", "weight": 3}]
    problem = refusal(written(tmp_path, "keys.json", json.dumps({"keys": entries})))
    assert problem.startswith("keys[1] gives tenant 'acme' another weight or max_queued_prefill_tokens than keys[0]")


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("keys.yaml", f"keys:\n  - key: {ACME}\n    tenant: [acme\n", "not valid YAML: "),
        ("keys.json", f'{{"keys": [{{"key": "{ACME}", }}]}}', "not valid JSON: Expecting property name"),
        ("keys.yaml", "", "Input should be a valid dictionary"),
        ("keys.yaml", "keys: []\n", "keys: List should have at least 1 item"),
        ("keys.yaml", f"- key: {ACME}\n  tenant: acme\n", "Input should be a valid dictionary"),
        ("keys.yaml", f"key: {ACME}\n", "keys: Field required"),
    ],
)
def test_a_bad_file_is_refused_saying_where(tmp_path: Path, name: str, text: str, problem: str) -> None:
    assert problem in refusal(written(tmp_path, name, text))


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    assert refusal(tmp_path / "absent.yaml") == "cannot read it (No such file or directory)"


def test_every_entry_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = key_table.hmac.compare_digest
    monkeypatch.setattr(key_table.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    table = KeyTable([(ACME.encode(), Tenant("acme")), (BETA.encode(), Tenant("beta")), (b"k", Tenant("k"))])
    for presented, tenant in [(ACME, Tenant("acme")), ("nope", None), ("a much longer guess" * 10, None)]:
        calls.clear()
        assert table.tenant_of(presented.encode()) == tenant
        # Every entry, the first one matching or none: which entry matched does not show in the time taken. Digests
        # of one length: nor does how long a key is, or how much of a guess is right.
        assert len(calls) == 3 and {len(a) for pair in calls for a in pair} == {32}
