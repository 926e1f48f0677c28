"""`benchmarks.first_text`: the tokens it reads off a stream, its table and its arguments."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks import first_text


def stream_of(texts: list[str]) -> bytes:
    """sglang's ``/generate`` stream: cumulative text and the tokens generated so far, then ``[DONE]``."""
    lines = [
        b"data: " + json.dumps({"text": t, "meta_info": {"completion_tokens": i + 1}}).encode() + b"\n\n"
        for i, t in enumerate(texts)
    ]
    return b"".join(lines) + b"data: [DONE]\n\n"


@pytest.fixture
def server() -> Iterator[tuple[str, list[bytes]]]:
    """A local server that streams whatever the test puts in the list, and its URL."""
    bodies: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            body = bodies.pop(0)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", bodies
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_tokens_generated_when_the_first_text_came(server: tuple[str, list[bytes]]) -> None:
    url, bodies = server
    bodies += [stream_of(["", "", "ab", "abc"]), stream_of(["x"]), stream_of(["", ""])]
    assert [first_text.tokens_to_first_text(url, "q") for _ in range(3)] == [3, 1, None]


def test_the_table_gives_each_share_of_the_chats(capsys: pytest.CaptureFixture[str]) -> None:
    first_text.print_table(10, {"bytes": Counter({1: 5, 2: 2, 3: 1, 5: 1, None: 1})})
    row = capsys.readouterr().out.splitlines()[-1]
    assert row == "| bytes | 50% | 20% | 10% | 10% | 10% | 1.89 |"


def test_a_count_below_one_is_refused_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        first_text.parse_args(["--chats", "0"])
    assert stop.value.code == 2 and "--chats 0" in capsys.readouterr().err
