"""sglang's KV event stream as the replica's held prefixes, without an sglang process: sglang's own event classes,
encoded as its publisher encodes them (its `ZmqEventPublisher` where a stand-in engine publishes), read by the
backend's subscriber (`engines.sglang.kv_events`) and published through `SglangBackend.held_prefixes`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import zmq
from sglang.srt.disaggregation.kv_events import AllBlocksCleared, KVEventBatch, StorageMedium, ZmqEventPublisher
from sglang.srt.disaggregation.kv_events import BlockRemoved as SglangBlockRemoved
from sglang.srt.disaggregation.kv_events import BlockStored as SglangBlockStored

from serve_app.config import ConfigError, EngineKnobs
from serve_app.engines.sglang import kv_events
from serve_app.engines.sglang.kv_events import TOPIC, KvEventStream, to_kv_events
from serve_app.engines.sglang.sglang_backend import SglangBackend
from serve_app.replica.held_prefixes import AllCleared, BlockRemoved, BlockStored, KvEvent
from serve_app.routing.prefix_pages import page_hashes
from tests.serve.fake_sglang import DEADLINE_S, FakeSglangEngine, until_async
from tests.serve.fake_sglang import fake_backend as backend


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    # The backend exports the policy as FAIRSHARE_* variables: keep them inside the test.
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if not k.startswith("FAIRSHARE_")})
    monkeypatch.setattr(FakeSglangEngine, "started", [])
    monkeypatch.setattr(FakeSglangEngine, "kv_events", True)


def stored(hashes: list[int], parent: int | None, tokens: list, medium: str | None = StorageMedium.GPU, **kw):
    """sglang's `BlockStored` as its radix cache records it (page size 1: one token per block)."""
    return SglangBlockStored(
        block_hashes=hashes, parent_block_hash=parent, token_ids=tokens, block_size=1, lora_id=None, medium=medium, **kw
    )


def wire(events: list) -> bytes:
    """A batch as sglang's publisher thread encodes it."""
    return msgspec.msgpack.Encoder().encode(KVEventBatch(ts=time.time(), events=events))


def decoded(events: list) -> list[KvEvent]:
    return to_kv_events(msgspec.msgpack.Decoder(type=KVEventBatch).decode(wire(events)))


def test_sglang_events_become_ours_gpu_tier_and_default_namespace_only() -> None:
    root = stored([11, 12, 13], None, [5, 6, 7])
    child = stored([14, 15], 13, [8, 9])
    ours = decoded(
        [
            AllBlocksCleared(),
            root,
            child,
            stored([21], 15, [1], medium=StorageMedium.CPU),  # the host tier (HiCache): not reusable as is
            stored([31], None, [1], cache_salt="tenant-a"),  # a namespace the router's pages cannot name
            stored([32], None, [1], lora_name="adapter"),
            stored([41], None, [2], medium=None),  # a sender without the field: the GPU pool
            SglangBlockRemoved(block_hashes=[15, 14], medium=StorageMedium.GPU),
            SglangBlockRemoved(block_hashes=[13], medium=StorageMedium.CPU),
            SglangBlockRemoved(block_hashes=[41]),
        ]
    )
    assert ours == [
        AllCleared(),
        BlockStored([11, 12, 13], None, [5, 6, 7], 1),
        BlockStored([14, 15], 13, [8, 9], 1),
        BlockStored([41], None, [2], 1),
        BlockRemoved([15, 14]),
        BlockRemoved([41]),
    ]
    assert all(isinstance(h, int) for e in ours if isinstance(e, BlockStored) for h in e.block_hashes)


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S} s: {what}"
        time.sleep(0.01)


class Heard:
    """A stream's sink: what it was handed (on the subscriber's thread), taken under a lock."""

    def __init__(self) -> None:
        self._events: list[KvEvent] = []
        self._lock = threading.Lock()

    def __call__(self, events: list[KvEvent]) -> None:
        with self._lock:
            self._events.extend(events)

    def take(self) -> list[KvEvent]:
        with self._lock:
            taken, self._events = self._events, []
        return taken


class Publisher:
    """A bare PUB socket on the stream's endpoint, sending sglang's wire format with chosen sequence numbers."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(endpoint)
        self.seq = 0

    def send(self, payload: bytes, seq: int | None = None) -> None:
        self.seq = self.seq if seq is None else seq
        self.pub.send_multipart([TOPIC.encode(), self.seq.to_bytes(8, "big"), payload])
        self.seq += 1

    def joined(self, stream: KvEventStream) -> None:
        """Until the subscriber has received everything sent (a PUB drops what it sends before a subscriber is
        connected): probes, each a batch as sglang's first (its cache's `AllBlocksCleared`)."""

        def heard() -> bool:
            self.send(wire([AllBlocksCleared()]))
            time.sleep(0.02)
            return stream.num_batches > 0

        until(heard, "the subscriber connected")
        until(lambda: stream.next_seq == self.seq, "every probe received")

    def close(self) -> None:
        self.pub.close(linger=0)
        self.ctx.term()


def test_a_missed_or_undecodable_batch_clears_what_was_held() -> None:
    heard = Heard()
    stream = KvEventStream(heard)
    pub = Publisher(stream.endpoint)
    try:
        pub.joined(stream)
        batches, lost = stream.num_batches, stream.num_lost
        heard.take()
        pub.send(wire([stored([1, 2], None, [3, 4])]))  # in sequence
        pub.send(wire([stored([5], 2, [6])]), seq=pub.seq + 2)  # two batches missed: they may have evicted
        pub.send(wire([stored([7], 5, [(6, 7)])]))  # EAGLE's bigram keys: not sglang's declared `list[int]`
        until(lambda: stream.num_batches == batches + 3, "three batches")
        assert stream.num_lost == lost + 2
        assert heard.take() == [
            BlockStored([1, 2], None, [3, 4], 1),
            AllCleared(),
            BlockStored([5], 2, [6], 1),
            AllCleared(),
        ]
    finally:
        stream.stop()
        pub.close()
    assert not Path(stream.endpoint.removeprefix("ipc://")).exists()


def test_a_stream_stops_at_once_whether_its_thread_waits_or_has_failed() -> None:
    """The thread waits on its sockets with no timeout: `stop` wakes it, and finds nothing to wake when the sink
    failed and the thread ended (then the sink was told to clear what it held)."""
    heard = Heard()
    waiting = KvEventStream(heard)
    waiting.stop()
    assert not waiting._thread.is_alive()

    cleared: list[list[KvEvent]] = []

    def failing(events: list[KvEvent]) -> None:
        cleared.append(events)
        if events != [AllCleared()]:
            raise RuntimeError("the sink failed")

    failed = KvEventStream(failing)
    pub = Publisher(failed.endpoint)

    def ended() -> bool:
        pub.send(wire([AllBlocksCleared()]))  # until the subscriber has joined and a batch reaches the sink
        time.sleep(0.02)
        return not failed._thread.is_alive()

    try:
        until(ended, "the sink fails")
        assert cleared[-1] == [AllCleared()]
    finally:
        failed.stop()
        pub.close()
    assert not Path(failed.endpoint.removeprefix("ipc://")).exists()


def test_the_endpoints_folder_goes_with_the_last_stream_of_the_process(monkeypatch) -> None:
    # Serve ends a replica's process without its exit handlers: the folder goes when its streams stop. This test
    # process may hold other tests' streams: it counts from none.
    monkeypatch.setattr(kv_events, "_private_dir", None)
    monkeypatch.setattr(kv_events, "_private_dir_users", 0)
    first, second = KvEventStream(Heard()), KvEventStream(Heard())
    folder = Path(first.endpoint.removeprefix("ipc://")).parent
    assert Path(second.endpoint.removeprefix("ipc://")).parent == folder
    first.stop()
    first.stop()  # twice counts once
    assert folder.is_dir()  # the second stream's endpoints are in it
    second.stop()
    assert not folder.exists()
    third = KvEventStream(Heard())  # a later engine start gets a new one
    try:
        assert Path(third.endpoint.removeprefix("ipc://")).parent.is_dir()
    finally:
        third.stop()


def test_a_new_endpoints_folder_removes_those_of_killed_processes_and_keeps_the_living(monkeypatch) -> None:
    # A replica's process killed before its streams stopped leaves its folder; the next one made here removes it.
    monkeypatch.setattr(kv_events, "_private_dir", None)
    monkeypatch.setattr(kv_events, "_private_dir_users", 0)
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")  # where the module makes its folder: a short socket path
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    parent = Path("/tmp")
    killed = Path(tempfile.mkdtemp(prefix=f"{kv_events.PRIVATE_DIR_PREFIX}{int(ended.stdout)}-", dir=parent))
    (killed / "stale-socket").touch()
    living = Path(tempfile.mkdtemp(prefix=f"{kv_events.PRIVATE_DIR_PREFIX}{os.getppid()}-", dir=parent))
    stream = KvEventStream(Heard())
    try:
        assert Path(stream.endpoint.removeprefix("ipc://")).parent.parent == parent
        assert not killed.exists()
        assert living.is_dir()
    finally:
        stream.stop()
        living.rmdir()


def test_a_gap_is_filled_from_the_engines_replay_buffer_and_nothing_is_cleared(tmp_path) -> None:
    # sglang's own publisher holds what it sent (its live socket here is one nobody hears) and answers the replay
    # socket; the gap comes on the live stream, the batches it skipped only from the replay.
    heard = Heard()
    stream = KvEventStream(heard)
    live = Publisher(stream.endpoint)
    engine = ZmqEventPublisher(0, f"ipc://{tmp_path}/unheard", stream.replay_endpoint, topic=TOPIC)
    try:
        live.joined(stream)
        batches, lost = stream.num_batches, stream.num_lost
        heard.take()
        skipped = [[stored([1, 2], None, [3, 4])], [SglangBlockRemoved(block_hashes=[2], medium=StorageMedium.GPU)]]
        for events in [[AllBlocksCleared()]] * live.seq + skipped:  # the engine's numbering up to the gap
            engine.publish(KVEventBatch(ts=time.time(), events=events))
        engine._event_queue.join()  # its thread has sent and buffered them all (as before any later live batch)
        live.send(wire([stored([5], 1, [6])]), seq=live.seq + len(skipped))
        until(lambda: stream.num_batches == batches + 1, "the batch after the gap")
        assert stream.num_lost == lost
        assert heard.take() == [BlockStored([1, 2], None, [3, 4], 1), BlockRemoved([2]), BlockStored([5], 1, [6], 1)]
    finally:
        stream.stop()
        live.close()
        engine.shutdown()


def subscribers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "sglang-kv-events"}


async def joined(b: SglangBackend, engine: FakeSglangEngine) -> None:
    """Until the backend's subscriber hears the engine (sglang's first batch is its cache's `AllBlocksCleared`)."""

    def heard() -> bool:
        engine.publish_kv_events([AllBlocksCleared()])
        return b.describe()["held_prefixes"]["event_batches"] > 0

    await until_async(heard, "the subscriber hears the engine")


DOC = [(7 * i) % 1000 for i in range(200)]
"""A prompt of 200 tokens: three whole router pages."""
HASHES = list(range(1000, 1200))
"""Its engine blocks (page size 1)."""


def store_doc(engine: FakeSglangEngine) -> None:
    # Chunked prefill: the first chunk's node, then the rest extending it.
    engine.publish_kv_events([stored(HASHES[:130], None, DOC[:130])])
    engine.publish_kv_events([stored(HASHES[130:], HASHES[129], DOC[130:])])


def test_a_stored_chain_is_published_then_unpublished_as_it_is_evicted() -> None:
    before = subscribers()  # other tests' backends, never shut down, may hold theirs
    pages = page_hashes(DOC)
    assert len(pages) == 3

    async def go() -> None:
        b = backend()
        await b.start()
        try:
            (engine,) = FakeSglangEngine.started
            config = json.loads(engine.kwargs["kv_events_config"])
            assert config["publisher"] == "zmq" and config["endpoint"].startswith("ipc://")
            assert b.held_prefixes(10) == []
            await joined(b, engine)
            store_doc(engine)
            await until_async(lambda: set(b.held_prefixes(10)) == set(pages), "the document's pages published")
            assert b.held_prefixes(1) == [pages[0]]  # a bounded publication is a prefix, from its first page
            engine.publish_kv_events([SglangBlockRemoved(block_hashes=HASHES[130:], medium=StorageMedium.GPU)])
            await until_async(lambda: set(b.held_prefixes(10)) == set(pages[:2]), "the evicted leaf's page gone")
            engine.publish_kv_events([SglangBlockRemoved(block_hashes=HASHES[:130], medium=StorageMedium.GPU)])
            await until_async(lambda: b.held_prefixes(10) == [], "every page gone")
            held = b.describe()["held_prefixes"]
            assert (held["pages"], held["engine_blocks"], held["skipped_blocks"]) == (0, 0, 0)
        finally:
            await b.shutdown()

    asyncio.run(go())
    assert not subscribers() - before  # the subscriber stopped


def test_a_restart_starts_from_nothing_held_on_a_new_endpoint() -> None:
    before = subscribers()  # other tests' backends, never shut down, may hold theirs

    async def go() -> None:
        b = backend()
        await b.start()
        try:
            first = FakeSglangEngine.started[0]
            await joined(b, first)
            store_doc(first)
            await until_async(lambda: len(b.held_prefixes(10)) == 3, "the document's pages published")
            b.reconfigure(EngineKnobs(policy={"max_running_requests": 8}))  # sglang takes a policy only at start
            assert await b.restart_if_needed()
            assert b.held_prefixes(10) == []  # the new engine holds nothing yet
            second = FakeSglangEngine.started[1]
            assert second.kwargs["kv_events_config"] != first.kwargs["kv_events_config"]
            await joined(b, second)
            second.publish_kv_events([stored(HASHES[:64], None, DOC[:64])])
            await until_async(lambda: b.held_prefixes(10) == [page_hashes(DOC)[0]], "the new engine's page")
        finally:
            await b.shutdown()
        assert b.held_prefixes(10) == []

    asyncio.run(go())
    assert not subscribers() - before


def test_a_users_kv_events_config_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="kv_events_config"):
        backend(kv_events_config='{"publisher": "zmq", "endpoint": "tcp://*:5557"}')
