"""The Serve app's layout rules, read from its source: modules stay short, and only the sim backend needs the
simulator (every other backend declares its own capacity)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVE_APP = Path(__file__).resolve().parent.parent / "serve_app"
MAX_MODULE_LINES = 300
MODULES = sorted(p for p in SERVE_APP.rglob("*.py") if "__pycache__" not in p.parts)


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_layout_finds_the_serve_app() -> None:
    assert SERVE_APP / "replica" / "engine_replica.py" in MODULES
    assert SERVE_APP / "engines" / "sim" / "sim_backend.py" in MODULES


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SERVE_APP)))
def test_a_serve_app_module_stays_short(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_MODULE_LINES


@pytest.mark.parametrize(
    "path", [p for p in MODULES if p.parent.name != "sim"], ids=lambda p: str(p.relative_to(SERVE_APP))
)
def test_only_the_sim_backend_imports_the_simulator(path: Path) -> None:
    simulator = {m for m in imported_modules(path) if m == "scheduler.sim" or m.startswith("scheduler.sim.")}
    assert not simulator, f"{path.name} imports {sorted(simulator)}"


def test_the_import_rule_sees_a_function_level_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from scheduler.sim.presets import PRESETS\n    return PRESETS\n")
    assert "scheduler.sim.presets" in imported_modules(module)


MAX_FOLDER_MODULES = 10


def test_no_serve_app_folder_holds_more_than_ten_modules() -> None:
    by_folder: dict[Path, list[str]] = {}
    for path in MODULES:
        if path.name != "__init__.py":
            by_folder.setdefault(path.parent, []).append(path.name)
    crowded = {str(folder.relative_to(SERVE_APP)): len(names) for folder, names in by_folder.items()}
    assert max(crowded.values()) <= MAX_FOLDER_MODULES, crowded


def test_no_two_serve_app_modules_share_a_name() -> None:
    names = [p.stem for p in MODULES if p.name != "__init__.py"]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_no_two_serve_app_classes_share_a_name() -> None:
    where: dict[str, list[str]] = {}
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(str(path.relative_to(SERVE_APP)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
