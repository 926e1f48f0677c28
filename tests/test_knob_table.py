"""The knob table in docs/policy.md is the one `PolicyConfig` generates."""

from __future__ import annotations

import pytest

from harness.knob_table import BEGIN, END, POLICY_DOC, render, replace_block
from scheduler.config import PolicyConfig, env_var_name


def test_the_docs_table_is_generated_from_the_config():
    text = POLICY_DOC.read_text()
    stale = "docs/policy.md's knob table differs from PolicyConfig: run python -m harness.knob_table"
    assert replace_block(text, render()) == text, stale


def test_every_field_has_a_row_with_its_variable_and_description():
    table = render()
    for name, field in PolicyConfig.model_fields.items():
        row = next(line for line in table.splitlines() if line.startswith(f"| `{env_var_name(name)}` |"))
        assert field.description and " ".join(field.description.split())[:40].replace("|", "\\|") in row


def test_a_changed_default_changes_the_table():
    class Changed(PolicyConfig):
        lookahead: int = PolicyConfig.model_fields["lookahead"].default + 1  # type: ignore[assignment]

    assert render(Changed) != render()


def test_markers_must_appear_once_in_order():
    with pytest.raises(ValueError):
        replace_block(f"{END}\n{BEGIN}\n", "t")
    with pytest.raises(ValueError):
        replace_block(f"{BEGIN}\nx\n", "t")
    assert replace_block(f"a\n{BEGIN}\nold\n{END}\nb", "new") == f"a\n{BEGIN}\nnew\n{END}\nb"
