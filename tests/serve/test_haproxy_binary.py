"""The images' HAProxy (`serve_app.config.haproxy_binary`): the wrapper runs Ray's bundled binary with splice off, and
Serve's front runs it where the controller's environment names it, as the KubeRay overlays do: streams read whole and
streams a client leaves both behave as on the bundled binary."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.net import listener
from serve_app.config import haproxy_binary
from serve_app.config.haproxy_binary import NO_SPLICE, bundled_binary, main, write_wrapper
from tests.serve.conftest import ServeHandle, serving

SHORT = [{"role": "user", "content": "Does the front still answer?"}]


def test_the_wrapper_runs_the_bundled_haproxy_with_splice_off(tmp_path: Path) -> None:
    path = write_wrapper(tmp_path / "bin" / "haproxy-nosplice")
    assert os.access(path, os.X_OK)
    assert path.read_text().splitlines()[-1] == f'exec {shlex.quote(bundled_binary())} {NO_SPLICE} "$@"'
    version = subprocess.run([str(path), "-v"], capture_output=True, text=True, timeout=30)
    assert version.returncode == 0 and version.stdout.startswith("HAProxy version"), version.stderr


def test_a_relative_path_is_refused_by_name(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bin/haproxy"])
    assert exit_.value.code == 2 and "'bin/haproxy' is not an absolute path" in capsys.readouterr().err
    assert main([str(tmp_path / "haproxy")]) == 0 and (tmp_path / "haproxy").exists()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeHandle]:
    wrapper = write_wrapper(tmp_path_factory.mktemp("bin") / "haproxy-nosplice")
    with serving(controller_env={haproxy_binary.ENV: str(wrapper)}) as handle:
        yield handle


@pytest.mark.serve
def test_serves_front_runs_the_wrapper_and_streams_whole_and_left(served: ServeHandle) -> None:
    front = listener(int(served.base_url.rsplit(":", 1)[1]))
    assert front is not None and front.name() == "haproxy" and NO_SPLICE in front.cmdline()
    body = {"model": served.model, "messages": SHORT, "max_tokens": 8, "stream": True}
    with httpx.Client(timeout=30) as client:
        r = client.post(f"{served.base_url}/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
        # A client that leaves mid-stream: its request is aborted in the engine, and the front serves the next one.
        long = {**body, "max_tokens": 3000}
        with client.stream("POST", f"{served.base_url}/v1/chat/completions", json=long) as r:
            replica = r.headers["x-replica"]
            lines = r.iter_lines()
            rid = next(line for line in lines if line.startswith("data: {")).split('"id":"')[1].split('"')[0]
    deadline = time.monotonic() + 10
    while rid in (info := served.replica(replica))["active_request_ids"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rid not in info["active_request_ids"] and info["counters"]["aborted"] >= 1
    with httpx.Client(timeout=30) as client:
        assert client.post(f"{served.base_url}/v1/chat/completions", json=body).status_code == 200
