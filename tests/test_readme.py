from pathlib import Path

from scheduler.config import PolicyConfig, env_var_name

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_readme_documents_every_policy_knob():
    missing = [env_var_name(f) for f in PolicyConfig.model_fields if f"`{env_var_name(f)}`" not in README]
    assert missing == []


def test_quick_start_is_two_commands():
    quick = README.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in quick.strip().splitlines()] == ["make serve", "make test"]


def test_knob_table_defaults_match_the_code():
    table = README.split("### Knobs", 1)[1].split("\n\n", 2)[2].split("\n\n", 1)[0]
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:]]
    documented = {name.strip().strip("`"): default.strip() for name, default in rows}
    assert set(documented) == {env_var_name(f) for f in PolicyConfig.model_fields}
    for field, info in PolicyConfig.model_fields.items():
        default = documented[env_var_name(field)]
        if info.default is None:
            assert default.startswith("unset"), field
        else:
            assert default == f"`{str(info.default).lower()}`", field
