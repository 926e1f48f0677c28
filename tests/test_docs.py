"""The README and the docs held to the code: the quick start, the plugin's switch table, and the commands they tell
a reader to run. (The policy's knob table is generated: `tests/test_knob_table.py`.)"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from scheduler.config import PolicyConfig, env_value, env_var_name
from scheduler.sglang_plugin import env as plugin_env
from scheduler.sglang_plugin.server_args import SGLANG_OWNED_FIELDS

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
DOCS = REPO / "docs"
OUR_PACKAGES = {"scheduler", "serve_app", "harness", "benchmarks", "loadtests", "tests"}

PLUGIN_SWITCHES = {
    plugin_env.PLUGIN_ENABLED_VAR,
    plugin_env.PLUGIN_FORCE_VAR,
    plugin_env.PASS_TRACE_VAR,
    plugin_env.PLUGIN_CLOCK_VAR,
}


def _doc(name: str) -> str:
    return (DOCS / name).read_text()


def _documents() -> dict[str, str]:
    return {"README.md": README} | {f"docs/{p.name}": p.read_text() for p in sorted(DOCS.glob("*.md"))}


def _switch_table() -> dict[str, str]:
    """The sglang plugin's switch table: variable -> its default column."""
    section = _doc("sglang-plugin.md").split("\n## Switches\n", 1)[1]
    table = section.split("\n| variable |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:]]
    return {name.strip().strip("`"): default.strip() for name, default in rows}


def test_quick_start_is_two_commands():
    quick = README.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in quick.strip().splitlines()] == ["make serve", "make test"]


def test_plugin_doc_documents_every_policy_knob_and_switch():
    assert set(_switch_table()) == {env_var_name(f) for f in PolicyConfig.model_fields} | PLUGIN_SWITCHES


def test_plugin_switch_defaults_match_the_code():
    documented = _switch_table()
    for field, info in PolicyConfig.model_fields.items():
        default = documented[env_var_name(field)]
        if field in SGLANG_OWNED_FIELDS:
            assert default.startswith("sglang's"), field
        elif info.default is None:
            assert default.startswith("unset"), field
        else:
            value = env_value(info.get_default(call_default_factory=True))
            assert default.split()[0] == f"`{value.lower()}`", field


def test_every_module_the_docs_run_exists():
    for where, text in _documents().items():
        for module in re.findall(r"python -m ([A-Za-z_][\w.]*)", text):
            # `benchmarks.NAME` is a placeholder, not a module.
            if module.split(".")[0] in OUR_PACKAGES and module.islower():
                assert importlib.util.find_spec(module) is not None, (where, module)


def test_the_docs_run_benchmarks_as_modules():
    for where, text in _documents().items():
        assert re.search(r"python3? (benchmarks|loadtests|harness)/\w+\.py", text) is None, where


OPERATOR_PAGES = [
    "glossary.md",
    "install.md",
    "deploy-gpu.md",
    "kubernetes.md",
    "tuning.md",
    "autoscaling.md",
    "observability.md",
    "operations.md",
    "troubleshooting.md",
]
HISTORY = re.compile(r"\bissues? #?\d+\b|\b20\d\d-\d\d-\d\d\b|\bthis session\b", re.IGNORECASE)
"""What a lab notebook says and a page must not: issue numbers, dates, sessions (history: CHANGELOG.md and
docs/results/)."""


def test_the_docs_explain_and_leave_the_history_to_the_changelog():
    for where, text in _documents().items():
        assert HISTORY.search(text) is None, (where, HISTORY.search(text))
    assert (REPO / "CHANGELOG.md").exists()


def test_the_readme_lists_every_operator_page_in_order():
    index = README.split("\n## Docs\n", 1)[1].split("\n## ", 1)[0]
    links = re.findall(r"\(docs/([\w-]+\.md)\)", index)
    assert links[: len(OPERATOR_PAGES)] == OPERATOR_PAGES
    assert all((DOCS / page).exists() for page in OPERATOR_PAGES)
    assert set(links) >= {p.name for p in DOCS.glob("*.md")}, "a page the README does not list"
