"""The few kustomize features `k8s/` uses, in Python, so the tests render the overlays without a binary.

- `resources`: YAML files, and directories holding a `kustomization.yaml` (rendered first, in order).
- `patches`: `path` (a file) or `patch` (inline), with an optional `target` (`kind`, `name`). A YAML list is an
  RFC 6902 JSON patch, applied to the target with `jsonpatch`. A mapping is a merge patch on the resource
  with its `kind` and `metadata.name`: maps merge, `null` deletes. It may hold no list: kustomize merges
  lists of named items where RFC 7386 replaces them, and a renderer must not guess which one a patch meant.
- `images`: `name`, `newName`, `newTag` on every `containers`/`initContainers` entry at any depth (kustomize
  does the same for custom resources such as a RayService).

Anything else in a kustomization is an error, so `k8s/` cannot start using a feature this renderer ignores.
`tests/k8s/test_manifests.py` checks the output against `kubectl kustomize` where kubectl is installed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

KUSTOMIZATION = "kustomization.yaml"
KEYS = {"apiVersion", "kind", "resources", "patches", "images"}
PATCH_KEYS = {"path", "patch", "target"}
TARGET_KEYS = {"kind", "name"}
IMAGE_KEYS = {"name", "newName", "newTag"}


class KustomizeError(ValueError):
    pass


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def render(directory: Path) -> list[dict[str, Any]]:
    """The resources `kubectl kustomize DIRECTORY` prints, in the order they are declared."""
    kustomization = yaml.safe_load((directory / KUSTOMIZATION).read_text())
    _only(kustomization, KEYS, directory / KUSTOMIZATION)
    resources: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        resources += render(path) if path.is_dir() else load_docs(path)
    for patch in kustomization.get("patches", []):
        _only(patch, PATCH_KEYS, f"{directory / KUSTOMIZATION}: patches")
        resources = _apply(resources, patch, directory)
    for image in kustomization.get("images", []):
        _only(image, IMAGE_KEYS, f"{directory / KUSTOMIZATION}: images")
        for resource in resources:
            _set_image(resource, image)
    return resources


def _only(mapping: dict[str, Any], allowed: set[str], where: object) -> None:
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise KustomizeError(f"{where}: unsupported key(s) {unknown}; this renderer knows {sorted(allowed)}")


def _apply(resources: list[dict[str, Any]], patch: dict[str, Any], directory: Path) -> list[dict[str, Any]]:
    if ("path" in patch) == ("patch" in patch):
        raise KustomizeError(f"{directory}: a patch needs exactly one of `path` and `patch`")
    body = yaml.safe_load((directory / patch["path"]).read_text() if "path" in patch else patch["patch"])
    target = patch.get("target")
    if target is not None:
        _only(target, TARGET_KEYS, f"{directory}: patch target")
    if isinstance(body, list):
        if target is None:
            raise KustomizeError(f"{directory}: a JSON patch needs a `target`")
        return _patch_matching(resources, target, lambda r: jsonpatch.apply_patch(r, body))
    if not isinstance(body, dict):
        raise KustomizeError(f"{directory}: a patch must be a list of operations or a resource")
    target = target or {"kind": body.get("kind"), "name": body.get("metadata", {}).get("name")}
    return _patch_matching(resources, target, lambda r: _merge(r, body))


def _patch_matching(resources, target, patch_one) -> list[dict[str, Any]]:
    matched = [all(_field(r, k) == v for k, v in target.items()) for r in resources]
    if not any(matched):
        raise KustomizeError(f"no resource matches patch target {target}")
    return [patch_one(r) if hit else r for r, hit in zip(resources, matched, strict=True)]


def _field(resource: dict[str, Any], key: str) -> Any:
    return resource.get("metadata", {}).get("name") if key == "name" else resource.get(key)


def _merge(base: Any, patch: Any) -> Any:
    if isinstance(patch, list):
        raise KustomizeError("a merge patch may not hold a list (kustomize and RFC 7386 differ on lists)")
    if not isinstance(patch, dict) or not isinstance(base, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _set_image(node: Any, image: dict[str, str]) -> None:
    if isinstance(node, list):
        for item in node:
            _set_image(item, image)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in ("containers", "initContainers") and isinstance(value, list):
            for container in value:
                if _image_name(container.get("image", "")) == image["name"]:
                    container["image"] = _new_image(container["image"], image)
        _set_image(value, image)


def _split_image(reference: str) -> tuple[str, str | None]:
    if "@" in reference:
        raise KustomizeError(f"image {reference!r}: digests are not supported by this renderer")
    head, sep, tail = reference.rpartition(":")
    return (head, tail) if sep and "/" not in tail else (reference, None)


def _image_name(reference: str) -> str:
    return _split_image(reference)[0]


def _new_image(reference: str, image: dict[str, str]) -> str:
    name, tag = _split_image(reference)
    name, tag = image.get("newName", name), image.get("newTag", tag)
    return f"{name}:{tag}" if tag else name
