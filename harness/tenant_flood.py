"""A tenant that floods a real sglang server with documents, beside another tenant's lone document.

The flood's documents are sent at once; the lone document follows once the plugin's pass trace shows one of them
in prefill. Every request is a streamed OpenAI completion with its tenant in the ``x-smg-routing-key``
header, as the Serve app sends it (`scheduler.sglang_plugin.tenant_keys`). Read from the pass trace (decisions: who
started when, who got each pass's tokens) and the client's stream (the lone document's time to first token, against
the same document sent alone). Shared by tests/sglang_cpu/test_tenants_sglang.py and `benchmarks.tenant_share_sglang`.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cpu_env import CPU_SERVER_ARGS, cpu_sglang_env
from harness.sglang_server import LocalServer
from harness.sglang_traffic import StreamedCompletion, prompt_ids, trace_since, wait_for, wait_idle
from scheduler.pass_trace import read_pass_trace
from scheduler.tenants import tenant_key

FLOOD, LONE = "flood", "team"
"""The flooding tenant and the tenant with one document."""
SERVER_ARGS = [
    *CPU_SERVER_ARGS,
    "--chunked-prefill-size",
    "256",
    "--max-running-requests",
    "8",
    "--max-total-tokens",
    "24000",
]


@dataclass(frozen=True)
class Flood:
    num_flood_docs: int = 4
    doc_tokens: int = 4096
    """Every document's prompt, the lone one's too: 16 passes of the server's 256-token chunk."""
    max_new_tokens: int = 4


def tenant_server(model_dir: Path, trace: Path, log: Path, tenant_fairness: bool = True) -> LocalServer:
    """A CPU sglang server with the plugin and its pass trace on (tenant fairness on or off); start it with ``with``."""
    env = cpu_sglang_env(pass_trace=trace, tenant_fairness=tenant_fairness)
    return LocalServer(model_dir, SERVER_ARGS, env, log)


def send(server: LocalServer, rid: str, tenant: str, tokens: int, seed: int, flood: Flood) -> StreamedCompletion:
    headers = {"x-smg-routing-key": tenant_key(tenant)}
    return StreamedCompletion(server.port, rid, prompt_ids(tokens, seed), flood.max_new_tokens, headers)


def alone_ttft_s(server: LocalServer, flood: Flood, tag: str, seed: int) -> float:
    """The lone document's time to first token with nothing beside it (a prompt of its own: no cache hit)."""
    ttft = send(server, f"{tag}-alone", LONE, flood.doc_tokens, seed, flood).finish().ttft_s
    assert ttft is not None
    wait_idle(server)
    return ttft


@dataclass(frozen=True)
class FloodRun:
    records: list[dict[str, Any]]
    """The pass trace's planned passes from the flood's arrival on."""
    tenant_of: dict[str, str]
    lone: str
    lone_ttft_s: float

    def passes_admitting(self, rid: str) -> list[int]:
        """The planned passes (indices in `records`) that admitted a chunk of the request."""
        return [i for i, r in enumerate(self.records) if any(a[0] == rid for a in r["admitted"])]

    def first_pass(self, rid: str) -> int:
        return self.passes_admitting(rid)[0]

    def arrival_pass(self, rid: str) -> int:
        return next(i for i, r in enumerate(self.records) if rid in r["arrived"])

    def waiting_flood_docs(self) -> list[str]:
        """The flood's documents that had not started when the lone document arrived."""
        arrived = self.arrival_pass(self.lone)
        return [rid for rid, tenant in self.tenant_of.items() if tenant == FLOOD and self.first_pass(rid) >= arrived]

    def tokens_while_both_backlogged(self) -> dict[str, int]:
        """Prefill tokens by tenant over the passes that began with both tenants waiting or in prefill (a request
        is, from the pass it was first seen waiting in to the pass of its last chunk)."""
        spans = {rid: (self.arrival_pass(rid), self.passes_admitting(rid)[-1]) for rid in self.tenant_of}
        tokens: dict[str, int] = defaultdict(int)
        for i, record in enumerate(self.records):
            backlogged = {self.tenant_of[rid] for rid, (first, last) in spans.items() if first <= i <= last}
            if backlogged == {FLOOD, LONE}:
                for rid, n in record["admitted"]:
                    tokens[self.tenant_of[rid]] += n
        return dict(tokens)

    def lone_share(self) -> float | None:
        """The lone document's share of the prefill while both tenants were backlogged."""
        tokens = self.tokens_while_both_backlogged()
        total = sum(tokens.values())
        return tokens.get(LONE, 0) / total if total else None


def run_flood(server: LocalServer, trace: Path, flood: Flood, tag: str, seed: int) -> FloodRun:
    """The flood, then the lone document once every flood document is in sglang's queue and one is in prefill (the
    flood's requests are sent at once, and on a loaded machine one could otherwise arrive after the lone document);
    returns once all have answered."""
    start = len(read_pass_trace(trace))
    docs = [f"{tag}-flood{i}" for i in range(flood.num_flood_docs)]
    sent = [send(server, rid, FLOOD, flood.doc_tokens, seed + i, flood) for i, rid in enumerate(docs)]

    def flood_queued_and_in_prefill() -> bool:
        records = trace_since(trace, start)
        admitted = {a[0] for r in records for a in r["admitted"]}
        seen = admitted.union(*(r["arrived"] for r in records))
        return seen.issuperset(docs) and not admitted.isdisjoint(docs)

    wait_for("the whole flood queued and its first document in prefill", flood_queued_and_in_prefill)
    lone = f"{tag}-lone"
    lone_stream = send(server, lone, LONE, flood.doc_tokens, seed + len(docs), flood)
    for stream in (*sent, lone_stream):
        stream.finish()
    wait_idle(server)
    tenant_of = {**dict.fromkeys(docs, FLOOD), lone: LONE}
    assert lone_stream.ttft_s is not None
    return FloodRun(trace_since(trace, start), tenant_of, lone, lone_stream.ttft_s)


def started_before(run: FloodRun, rids: Sequence[str]) -> bool:
    """Did the lone document's first chunk come before that of every request of `rids`?"""
    return all(run.first_pass(run.lone) < run.first_pass(rid) for rid in rids)


@dataclass(frozen=True)
class Measured:
    """Runs of the lone document alone and beside the flood, alternated on one server."""

    alone_ttft_s: list[float]
    runs: list[FloodRun]

    def rate_ratio(self) -> float:
        """The lone document's prefill rate beside the flood against alone: its median TTFTs' ratio (the same prompt
        length both ways; the median of a few runs, so one stall of a shared machine does not decide)."""
        return statistics.median(self.alone_ttft_s) / statistics.median(r.lone_ttft_s for r in self.runs)


def measure(server: LocalServer, trace: Path, flood: Flood, num_runs: int, tag: str = "run") -> Measured:
    """`num_runs` times: the lone document alone, then beside the flood (every prompt its own: no cache hits)."""
    alone_ttft_s(server, flood, f"{tag}-warm-up", seed=9_999)  # a fresh server's first prefill is slower
    alone: list[float] = []
    runs: list[FloodRun] = []
    for k in range(num_runs):
        alone.append(alone_ttft_s(server, flood, f"{tag}{k}", seed=10_000 + k))
        runs.append(run_flood(server, trace, flood, f"{tag}{k}", seed=20_000 + 100 * k))
    return Measured(alone, runs)
