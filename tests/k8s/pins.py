"""Versions the project pins: pyproject.toml's dependencies and the Makefile's installs (sglang, torch)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def project_pins() -> dict[str, str]:
    project = pyproject()["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    pins = {}
    for text in requirements:
        req = Requirement(text)
        (spec,) = req.specifier
        assert spec.operator == "==", text
        pins[req.name] = spec.version
    return pins


def makefile_pins() -> dict[str, str]:
    """`pip install ... NAME==VERSION` lines of the Makefile."""
    return dict(re.findall(r"pip install\b[^\n]*?\s([A-Za-z0-9_.-]+)==([0-9][^\s]*)", (REPO / "Makefile").read_text()))


def python_tag() -> str:
    """`py311` for `requires-python = ">=3.11"`: the Python the project is built and tested on."""
    (spec,) = Requirement(f"python{pyproject()['project']['requires-python']}").specifier
    return "py" + spec.version.replace(".", "")
