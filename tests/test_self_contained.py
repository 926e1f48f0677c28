"""A clone stands alone: no tracked file names a path outside the repository.

What the tests need from outside is vendored (the KubeRay CRD in `tests/k8s/crd/`); docs cite the source articles
by title, never by where a copy lives on some machine.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Split so that this file does not contain what it looks for.
OUTSIDE = (b"/" + b"work/", b"../" + b"shared", b"shared/" + b"seeds")
SKIPPED_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", "build", "dist"}


def tracked_files() -> list[Path]:
    """The files git tracks; outside a git checkout (an exported tree), every file but caches and the venv."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return [
            p
            for p in REPO.rglob("*")
            if p.is_file() and not SKIPPED_DIRS & set(p.relative_to(REPO).parts) and ".egg-info" not in str(p)
        ]
    return [REPO / name for name in out.decode().split("\0") if name]


def outside_paths(data: bytes) -> list[str]:
    return [pattern.decode() for pattern in OUTSIDE if pattern in data]


def test_no_tracked_file_names_a_path_outside_the_repository():
    files = tracked_files()
    assert len(files) > 100
    found = {str(p.relative_to(REPO)): hits for p in files if p.is_file() and (hits := outside_paths(p.read_bytes()))}
    assert found == {}


def test_the_check_finds_each_path():
    assert outside_paths(b"see " + OUTSIDE[0] + b"main/README.md") == [OUTSIDE[0].decode()]
    assert outside_paths(b"REPO.parent / " + OUTSIDE[1] + b"/k8s-schemas") == [OUTSIDE[1].decode()]
    assert outside_paths(b"kept in `" + OUTSIDE[2] + b"/`") == [OUTSIDE[2].decode()]
    assert outside_paths(b"a shared machine, workdir/ and shared_seeds") == []
