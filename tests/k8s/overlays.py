"""The kustomize directories of `k8s/` and their rendered resources (rendered once, copied per test)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from serve_app.config import kuberay
from tests.k8s.kustomize import render

K8S = Path(__file__).resolve().parents[2] / "k8s"
OVERLAYS = sorted(kuberay.OVERLAYS)
DIRECTORIES = {"base": K8S / "base", **{name: K8S / "overlays" / name for name in OVERLAYS}}

_rendered: dict[str, list[dict[str, Any]]] = {}


def rendered(name: str) -> list[dict[str, Any]]:
    """A fresh copy of the directory's resources (tests mutate them)."""
    if name not in _rendered:
        _rendered[name] = render(DIRECTORIES[name])
    return copy.deepcopy(_rendered[name])
