"""Tenants inside a real sglang server (CPU, tiny model): a tenant floods it with documents while another sends one
(`harness.tenant_flood`), every request naming its tenant in the ``x-smg-routing-key`` header as the Serve app does.

With tenant fairness on, the lone document starts as soon as the flood's document in prefill is done, before the
flood's later documents (sglang keeps one document in prefill, so tenants take turns a document at a time), and keeps
about half its rate alone; off, it waits behind the whole flood. Decisions are read from the plugin's pass trace and
asserted strictly; the rate, a wall-clock figure, loosely.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.sglang_server import LocalServer
from harness.tenant_flood import LONE, Flood, FloodRun, measure, run_flood, started_before, tenant_server

pytestmark = [pytest.mark.sglang_cpu, pytest.mark.timeout(1200)]  # two server starts on a loaded 2-core CPU

FLOOD = Flood()


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tenant-traces")


@pytest.fixture(scope="module")
def server_on(tiny_model_dir, trace_dir) -> Iterator[LocalServer]:
    with tenant_server(tiny_model_dir, trace_dir / "on.jsonl", trace_dir / "on.log") as server:
        yield server


@pytest.fixture(scope="module")
def server_off(tiny_model_dir, trace_dir) -> Iterator[LocalServer]:
    with tenant_server(tiny_model_dir, trace_dir / "off.jsonl", trace_dir / "off.log", tenant_fairness=False) as srv:
        yield srv


def describe(run: FloodRun) -> str:
    return f"first chunks by pass: {dict(sorted({rid: run.first_pass(rid) for rid in run.tenant_of}.items()))}"


def test_the_lone_document_starts_before_the_floods_later_documents_and_keeps_its_rate(server_on, trace_dir):
    measured = measure(server_on, trace_dir / "on.jsonl", FLOOD, num_runs=3)
    for run in measured.runs:
        later = run.waiting_flood_docs()
        assert len(later) >= FLOOD.num_flood_docs - 2, describe(run)  # it arrived early in the flood
        assert started_before(run, later), describe(run)
        # While both tenants waited the flood had only the rest of its document in prefill: the lone one got half.
        share = run.lone_share()
        assert share is not None and share >= 0.45, (share, run.tokens_while_both_backlogged())
    # It waited for the rest of one flood document, then prefilled as fast as alone: about half its rate alone.
    assert measured.rate_ratio() >= 0.4, (measured.alone_ttft_s, [r.lone_ttft_s for r in measured.runs])


def test_without_tenant_fairness_the_lone_document_waits_behind_the_flood(server_off, trace_dir):
    run = run_flood(server_off, trace_dir / "off.jsonl", FLOOD, "off", seed=30_000)
    flood_docs = [rid for rid, tenant in run.tenant_of.items() if tenant != LONE]
    assert all(run.first_pass(run.lone) > run.first_pass(rid) for rid in flood_docs), describe(run)
    share = run.lone_share()
    assert share is not None and share < 0.1, (share, run.tokens_while_both_backlogged())
