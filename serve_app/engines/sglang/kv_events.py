"""sglang's KV event stream as our events: what the engine's radix cache stores and evicts, for `HeldPrefixes`.

sglang 0.5.23 publishes its radix cache's `BlockStored` / `BlockRemoved` / `AllBlocksCleared`
(`sglang.srt.disaggregation.kv_events`) when `kv_events_config` is set: its scheduler process binds a ZeroMQ PUB
socket and sends each pass's events as one msgpack-encoded `KVEventBatch`, a multipart message (topic, sequence
number as 8 big-endian bytes, payload). `KvEventStream` is one engine start's subscriber: an `ipc://` endpoint of
its own in this process's private temporary directory (mode 0700: no other user on the node can read the token ids,
nothing can collide with it; sglang binds `ipc://` endpoints itself), a SUB socket connected to it before the
engine starts (zmq reconnects until sglang binds), and a daemon thread that decodes each batch with sglang's own
msgspec classes (`to_kv_events`) and hands our events to a sink. The replica's loop never waits on the socket.

Only what the GPU pool holds counts: host and disk tiers (HiCache) are not prefixes the next request reuses
without a load, and stores of a namespace the router's pages cannot name (a LoRA adapter, a `cache_salt`) are left
out, and so, by `HeldPrefixes`' rule, is whatever extends them. sglang's token ids are ints except with EAGLE's
bigram keys, whose batches do not decode as sglang's declared `list[int]`: such a batch counts as lost.

A gap in the sequence numbers is first asked of the engine's replay socket (sglang's `replay_endpoint`: a ROUTER
that resends the batches it buffered from a given number, `REPLAY_TIMEOUT_MS` at most): PUB/SUB drops what is sent
before a subscriber has joined, as the first batch (the radix cache's `AllBlocksCleared` at start) can be. A batch
still lost (not replayed, or undecodable) may have held an eviction: the sink then gets `AllCleared` first, so the
replica under-reports (the router's own record of what it sent fills in) rather than keep publishing a prefix the
engine dropped.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import zmq

from serve_app.replica.held_prefixes import AllCleared, BlockRemoved, BlockStored, KvEvent

if TYPE_CHECKING:
    from sglang.srt.disaggregation.kv_events import KVEventBatch

logger = logging.getLogger(__name__)

TOPIC = "kv"
GPU_MEDIUM = "GPU"  # sglang's `StorageMedium.GPU`; None from a sender that predates the field
REPLAY_TIMEOUT_MS = 1000
"""How long a replay's next batch may take (the engine's publisher thread answers between its own sends)."""
RECONNECT_MS = 10
"""How soon the SUB socket retries while sglang has not bound the endpoint yet (zmq's default: 100 ms)."""
PRIVATE_DIR_PREFIX = "fairshare-kv-"
"""Then the pid of the process whose engines' endpoints the directory holds."""
MAX_IPC_PATH = 80
"""A Unix socket path's limit is 107 bytes; a longer temporary directory falls back to /tmp."""

EventSink = Callable[[list[KvEvent]], None]

_private_dir: Path | None = None
_private_dir_lock = threading.Lock()
_private_dir_users = 0
"""Streams of this process whose endpoints are in `_private_dir` now."""


def _use_private_dir() -> Path:
    """This process's directory for its engines' endpoints, with one more stream using it. It is removed when its
    last stream stops (`_release_private_dir`), since Serve ends a replica's process without running its exit
    handlers (but only after the replica's shutdown has stopped its stream), and at exit. A process killed before
    either leaves its directory behind: the next one made on the machine removes it (`_remove_orphans`)."""
    global _private_dir, _private_dir_users
    with _private_dir_lock:
        _private_dir_users += 1
        if _private_dir is None or not _private_dir.is_dir():
            prefix = f"{PRIVATE_DIR_PREFIX}{os.getpid()}-"
            path = tempfile.mkdtemp(prefix=prefix)
            if len(path) > MAX_IPC_PATH:
                Path(path).rmdir()
                path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
            atexit.register(shutil.rmtree, path, ignore_errors=True)
            _private_dir = Path(path)
            _remove_orphans(_private_dir.parent)
        return _private_dir


def _remove_orphans(parent: Path) -> None:
    """Remove the endpoint directories in `parent` that this user's processes left when they were killed: those
    whose process is gone. (A pid reused since keeps its directory: the sweep errs on the side of leaving one.)"""
    for folder in parent.glob(f"{PRIVATE_DIR_PREFIX}*-*"):
        pid = folder.name.removeprefix(PRIVATE_DIR_PREFIX).split("-", 1)[0]
        with contextlib.suppress(OSError):
            if pid.isdigit() and folder.stat().st_uid == os.getuid() and not _alive(int(pid)):
                shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # no signal: only whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, another user's
    return True


def _release_private_dir() -> None:
    """One stream less; the last one out removes the directory (empty by then: each stream unlinks its sockets)."""
    global _private_dir, _private_dir_users
    with _private_dir_lock:
        _private_dir_users -= 1
        if _private_dir_users == 0 and _private_dir is not None:
            shutil.rmtree(_private_dir, ignore_errors=True)
            _private_dir = None


def engine_kv_events_config(endpoint: str, replay_endpoint: str) -> str:
    """sglang's `kv_events_config` for a publisher bound on `endpoint`, with its replay socket bound on
    `replay_endpoint` (sglang binds `ipc://` endpoints)."""
    return json.dumps({"publisher": "zmq", "endpoint": endpoint, "replay_endpoint": replay_endpoint, "topic": TOPIC})


def to_kv_events(batch: KVEventBatch) -> list[KvEvent]:
    """sglang's events as ours: GPU-tier events of the default namespace, in order."""
    from sglang.srt.disaggregation.kv_events import AllBlocksCleared
    from sglang.srt.disaggregation.kv_events import BlockRemoved as SglangBlockRemoved
    from sglang.srt.disaggregation.kv_events import BlockStored as SglangBlockStored

    out: list[KvEvent] = []
    for event in batch.events:
        if isinstance(event, AllBlocksCleared):
            out.append(AllCleared())
        elif event.medium not in (None, GPU_MEDIUM):
            continue
        elif isinstance(event, SglangBlockRemoved):
            out.append(BlockRemoved(event.block_hashes))
        elif isinstance(event, SglangBlockStored):
            if event.cache_salt is not None or event.lora_id is not None or event.lora_name is not None:
                continue
            out.append(BlockStored(event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size))
    return out


class KvEventStream:
    """Subscribes to one engine's KV events on a private endpoint; our events go to `sink` on its own thread.

    Make it before the engine (pass `engine_config()` as sglang's `kv_events_config`), `stop()` it after."""

    def __init__(self, sink: EventSink) -> None:
        self._sink = sink
        name, folder = uuid.uuid4().hex[:16], _use_private_dir()
        self._path, self._replay_path = folder / f"events-{name}", folder / f"replay-{name}"
        self.endpoint, self.replay_endpoint = f"ipc://{self._path}", f"ipc://{self._replay_path}"
        self.num_batches = 0
        self.num_lost = 0
        """Batches missed (a gap in the sequence) or undecodable; each cleared what the sink held."""
        self.next_seq = 0
        """The sequence number of the batch expected next (sglang's publisher counts from 0)."""
        self._stopping = threading.Event()
        self._ctx = zmq.Context()
        # Connected here, before the engine binds, so its first batch is not missed; used only by the thread after.
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
        self._sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
        self._sub.connect(self.endpoint)
        # `stop` wakes the thread through this pair, so that it waits on its sockets with no timeout: an idle engine
        # costs it no wake-ups (the thread uses `_woken`, `stop` the other end).
        self._woken, self._waker = self._ctx.socket(zmq.PAIR), self._ctx.socket(zmq.PAIR)
        self._woken.bind(f"inproc://stop-{name}")
        self._waker.connect(f"inproc://stop-{name}")
        self._thread = threading.Thread(target=self._run, name="sglang-kv-events", daemon=True)
        self._thread.start()

    def engine_config(self) -> str:
        return engine_kv_events_config(self.endpoint, self.replay_endpoint)

    def _run(self) -> None:
        try:
            # sglang imported here, not on the caller's loop: the first import takes seconds.
            from sglang.srt.disaggregation.kv_events import KVEventBatch

            decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
            poller = zmq.Poller()
            poller.register(self._sub, zmq.POLLIN)
            poller.register(self._woken, zmq.POLLIN)
            while not self._stopping.is_set():
                if self._sub in dict(poller.poll()):
                    self._received(self._sub.recv_multipart(), decoder)
        except Exception:
            logger.exception("sglang KV event subscriber failed: this replica stops publishing what its engine holds")
            with contextlib.suppress(Exception):
                self._sink([AllCleared()])
        finally:
            self._sub.close(linger=0)
            self._woken.close(linger=0)

    def _received(self, frames: list[bytes], decoder: msgspec.msgpack.Decoder[KVEventBatch]) -> None:
        if len(frames) != 3 or frames[0] != TOPIC.encode():
            return
        seq = int.from_bytes(frames[1], "big")
        events: list[KvEvent] = []
        if seq != self.next_seq:
            replayed = self._replayed(self.next_seq, seq, decoder) if seq > self.next_seq else None
            if replayed is None:
                self._lost(f"batches {self.next_seq}..{seq - 1} missed")
                events.append(AllCleared())
            else:
                events += replayed
        self.next_seq = seq + 1
        try:
            events += to_kv_events(decoder.decode(frames[2]))
        except msgspec.DecodeError as e:  # includes a validation error: bigram token ids
            self._lost(f"batch {seq} undecodable: {e}")
            events.append(AllCleared())
        self.num_batches += 1
        self._sink(events)

    def _replayed(self, first: int, end: int, decoder: msgspec.msgpack.Decoder[KVEventBatch]) -> list[KvEvent] | None:
        """Batches `first` to `end - 1` as our events, from the engine's replay socket (the frames sglang's
        `ZmqEventPublisher._service_replay` sends); None where it does not send them all in time, or one does not
        decode."""
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart([b"", first.to_bytes(8, "big")])
            events: list[KvEvent] = []
            expected = first
            while expected < end:
                if not dealer.poll(REPLAY_TIMEOUT_MS):
                    return None
                frames = dealer.recv_multipart()  # b"", topic, sequence number, payload (the end: an empty topic)
                if len(frames) != 4 or frames[1] != TOPIC.encode() or int.from_bytes(frames[2], "big") != expected:
                    return None
                events += to_kv_events(decoder.decode(frames[3]))
                expected += 1
            return events
        except msgspec.DecodeError:
            return None
        finally:
            dealer.close(linger=0)

    def _lost(self, why: str) -> None:
        self.num_lost += 1
        logger.warning("sglang KV events: %s; the replica publishes nothing it held before", why)

    def stop(self) -> None:
        """Stop the thread and remove the endpoint (the engine is stopped or stopping). Once: later calls do nothing."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        with contextlib.suppress(zmq.Again):  # the thread ended already (it failed): no one to wake
            self._waker.send(b"", zmq.NOBLOCK)
        self._waker.close(linger=0)
        self._thread.join(timeout=5)
        if self._thread.is_alive():  # stuck in the sink: close its socket from here
            self._ctx.destroy(linger=0)
        else:
            self._ctx.term()
        for path in (self._path, self._replay_path):  # sglang's sockets, left behind when its engine did not close them
            path.unlink(missing_ok=True)
        _release_private_dir()
