"""The policy's knob table in docs/policy.md, generated from `PolicyConfig` so the docs cannot drift from the code.

python -m harness.knob_table           # rewrite the table between the markers in docs/policy.md
python -m harness.knob_table --check   # exit 1 when the table differs from the code (a test runs this check)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from scheduler.config import PolicyConfig, env_var_name

REPO = Path(__file__).resolve().parents[1]
POLICY_DOC = REPO / "docs" / "policy.md"
BEGIN = "<!-- knobs:begin -->"
END = "<!-- knobs:end -->"


def default_text(field: FieldInfo) -> str:
    value: Any = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def render(config: type[PolicyConfig] = PolicyConfig) -> str:
    """The markdown table: one row per field, in the order the class declares them."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for name, field in config.model_fields.items():
        meaning = " ".join((field.description or "").split()).replace("|", "\\|")
        rows.append(f"| `{env_var_name(name)}` | {default_text(field)} | {meaning} |")
    return "\n".join(rows)


def replace_block(text: str, table: str) -> str:
    """`text` with the lines between the markers replaced by `table`; the markers must each appear once."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"expected one {BEGIN} line followed by one {END} line")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.knob_table", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    parser.add_argument("--doc", type=Path, default=POLICY_DOC, help="the markdown file holding the markers")
    args = parser.parse_args(argv)
    text = args.doc.read_text()
    updated = replace_block(text, render())
    if args.check:
        if updated != text:
            print(f"{args.doc}: the knob table differs from PolicyConfig; run python -m harness.knob_table")
            return 1
        return 0
    args.doc.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
