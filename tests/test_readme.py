from pathlib import Path

from scheduler.config import PolicyConfig, env_var_name

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
SLO_DOC = (ROOT / "docs" / "slo.md").read_text()
"""The SLO knobs' table lives with the SLO documentation; every other knob's in the README."""
KNOB_TABLES = ((README, "### Knobs"), (SLO_DOC, "## Knobs"))


def knob_table(text: str, heading: str) -> dict[str, str]:
    """variable -> default of the table after `heading` (one paragraph between them)."""
    table = text.split(heading, 1)[1].split("\n\n", 2)[2].split("\n\n", 1)[0]
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:]]
    return {name.strip().strip("`"): default.strip() for name, default in rows}


def test_the_docs_document_every_policy_knob():
    docs = README + SLO_DOC
    missing = [env_var_name(f) for f in PolicyConfig.model_fields if f"`{env_var_name(f)}`" not in docs]
    assert missing == []


def test_quick_start_is_two_commands():
    quick = README.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in quick.strip().splitlines()] == ["make serve", "make test"]


def test_knob_table_defaults_match_the_code():
    tables = [knob_table(text, heading) for text, heading in KNOB_TABLES]
    documented = {name: default for table in tables for name, default in table.items()}
    assert sum(map(len, tables)) == len(documented)  # no knob in two tables
    assert set(documented) == {env_var_name(f) for f in PolicyConfig.model_fields}
    for field, info in PolicyConfig.model_fields.items():
        default = documented[env_var_name(field)]
        if info.default is None:
            assert default.startswith("unset"), field
        else:
            assert default == f"`{str(info.default).lower()}`", field
