"""The chat-path benchmark's `engine` way on real CPU sglang: the engine in a process of its own, called through the
replica's serving path (`EngineThread`, `SglangOpenAI`), answers every chat, document and follow-up it is sent (each
follow-up after its document, re-sending the document's streamed answer) and times each."""

from __future__ import annotations

import pytest

from benchmarks import chat_path
from loadtests import peers

pytestmark = [pytest.mark.sglang_cpu, pytest.mark.timeout(1200)]  # an engine start on a loaded 2-core CPU


def test_the_engine_way_times_every_chat_document_and_follow_up_through_the_replicas_serving_path(tmp_path):
    model = peers.build_model(tmp_path, peers.EngineSettings().context_tokens)
    ttfts = chat_path.engine_ttfts(model, peers.chars_per_token(model), chat_path.Probes(3, 1), tmp_path)
    assert {kind: len(got) for kind, got in ttfts.items()} == {"chat": 3, "document": 1, "follow-up": 1}
    assert all(0 < t < 60 for got in ttfts.values() for t in got), ttfts  # seconds from the send to the first content
