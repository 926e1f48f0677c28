"""Ray's temp dir in a folder of a run's own: one way for every test and benchmark that starts Ray in-process.

While `own_ray_tmpdir` is open, ``RAY_TMPDIR`` names a new folder, so the Ray this process starts (and every node
and worker it spawns, which inherit the variable) keeps its sessions, sockets, logs and address file there, not in
the machine's ``/tmp/ray`` beside another Ray's. On exit the variable is restored and the folder removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def own_ray_tmpdir(prefix: str = "ray-") -> Iterator[Path]:
    """A fresh ``RAY_TMPDIR`` under ``/tmp`` while open; the folder is short-named there because Ray's unix socket
    paths under it must stay within the OS's ~107 characters."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = str(path)
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = before
        shutil.rmtree(path, ignore_errors=True)
