"""Figures of the peer benchmark (`loadtests.peers`): one column per front, this app's ratio to the best peer.

Requests are told apart by who sent them, the same way for every front (a stock sglang server says nothing of
traffic classes): chats (chat users), documents (a document user's first request on a document) and follow-ups
(its question on that document). Document prompt tokens/s: the documents' prompt tokens (less any reported as
cached) over the time during which at least one document was between its send and its first token, as
`report.long_prefill_tok_per_s` measures it. It is the product of two rows below it: each document's own rate (its
prompt tokens over its own wait for a first token) and how many documents waited at once, on average while any did.
The second follows when a few closed-loop users' documents happen to meet, and moves between rounds. Engine
prefix-cache hit rate: the prompt tokens the engines served from their cache over the prompt tokens they were sent,
both the engines' own counts (each stream's
`usage.prompt_tokens_details.cached_tokens` and `usage.prompt_tokens`, with sglang's `enable_cache_report`).
Chat TTFT inside the app: from the ingress's receipt to the engine's first item, as this app's `Server-Timing`
says (`recording.Sample.app_ttft_s`); the client's TTFT less it is the path outside the ingress. Chat TTFT with the
engines idle: chats sent one at a time before the load (`Front.idle_ttft_s`), the front's and the engine's own
latency; the loaded chat TTFT less it is what waiting beside the load adds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from loadtests.recording import Sample
from loadtests.report import long_prefill_tok_per_request_s, long_prefill_tok_per_s, long_prefills_at_once, pct

if TYPE_CHECKING:  # peers imports this module
    from loadtests.peers import EngineSettings

PEERS = ("cache_aware", "round_robin")
"""The fronts this app is judged against (`sglang-router` in front of stock sglang)."""
APP = "fairshare"
REFERENCE = "cache_aware"
"""The peer each workload's headline figures are set against (`headline`): the one that routes by prefix."""
TTFT_TARGET_S = 0.5
TBT_TARGET_S = 0.3
"""The SLO's defaults: a chat meets it when its first token comes within TTFT_TARGET_S and no gap between its
tokens exceeds TBT_TARGET_S."""
IDLE_TTFT_P50 = "chat TTFT p50, engines idle"
"""A chat alone on a front whose engines do nothing else: the path's own latency, without the load's."""

CHAT_TTFT_P99_RATIO = 0.25
DOC_RATE_RATIO = 0.9
"""Acceptance: this app's chat TTFT p99 at most this share of the best peer's, its document rate at least this."""


@dataclass
class Front:
    name: str
    samples: list[Sample]
    start_s: float
    load_start: float
    load_end: float
    locust_rc: int | None = None
    figures: dict[str, float | None] = field(init=False)
    """The table's figures of `samples`, computed once."""
    cpu_cores: dict[str, float] = field(default_factory=dict)
    """Cores each role used while the load ran (`loadtests.cpu_share`): engines, front, load generator."""
    cpu_waiting: dict[str, float] = field(default_factory=dict)
    """Cores-worth of each role's threads ready to run but waiting for a core (`CpuSampler.waiting_cores`)."""
    cpu_by_process: dict[str, float] = field(default_factory=dict)
    """Cores each kind of process used while the load ran (`CpuSampler.cores_by_kind`)."""
    cpu_waiting_by_process: dict[str, float] = field(default_factory=dict)
    """Cores-worth each kind of process waited for a core (`CpuSampler.waiting_cores_by_kind`)."""
    kv_pool_tokens: list[int] = field(default_factory=list)
    """Each engine's KV pool as sglang reports it (`max_total_num_tokens`); empty where the front does not say."""
    idle_ttft_s: list[float] = field(default_factory=list)
    """TTFTs of chats sent one at a time before the load (`loadtests.peers.idle_chat_ttfts`)."""
    span_s: float | None = None
    """Seconds from its first request's send to its last one's end (None: read from `samples`); a front pooled
    from several rounds (`pooled`) has the sum of its rounds' spans, not the wall time between them."""

    def __post_init__(self) -> None:
        self.figures = {**figures(self.samples), IDLE_TTFT_P50: pct(self.idle_ttft_s, 50)}
        if self.span_s is None:
            ends = [s.sent_at_s + (s.e2e_s or 0.0) for s in self.samples]
            self.span_s = max(ends) - min(s.sent_at_s for s in self.samples) if self.samples else 0.0

    @property
    def failures(self) -> int:
        return int(self.figures["failures"] or 0)


def _kind(s: Sample) -> str:
    if s.user == "chat":
        return "chat"
    return "doc" if s.intent == "long" else "followup"


def _ok(samples: Sequence[Sample], kind: str) -> list[Sample]:
    return [s for s in samples if s.ok and _kind(s) == kind]


def _ttfts(samples: Sequence[Sample], kind: str) -> list[float]:
    return [s.ttft_s for s in _ok(samples, kind) if s.ttft_s is not None]


def _app_ttfts(samples: Sequence[Sample], kind: str) -> list[float]:
    return [s.app_ttft_s for s in _ok(samples, kind) if s.app_ttft_s is not None]


def meets_slo(s: Sample) -> bool:
    return s.ttft_s is not None and s.ttft_s <= TTFT_TARGET_S and all(g <= TBT_TARGET_S for g in s.itl_s)


def _attainment(samples: Sequence[Sample]) -> float | None:
    chats = [s for s in samples if _kind(s) == "chat" and not s.shed]
    return 100.0 * sum(1 for s in chats if s.ok and meets_slo(s)) / len(chats) if chats else None


def cache_counts(samples: Sequence[Sample]) -> tuple[int, int] | None:
    """(cached, prompt) tokens summed over the answered requests whose usage gave both (the engines' counts);
    None when none did (an engine without `enable_cache_report` gives no cached count)."""
    counted = [s for s in samples if s.ok and s.prompt_tokens is not None and s.cached_tokens is not None]
    if not counted:
        return None
    return sum(s.cached_tokens or 0 for s in counted), sum(s.prompt_tokens or 0 for s in counted)


def hit_rate(samples: Sequence[Sample]) -> float | None:
    """Engine prefix-cache hit rate, %: sum(cached_tokens) / sum(prompt_tokens)."""
    counts = cache_counts(samples)
    return 100.0 * counts[0] / counts[1] if counts and counts[1] else None


def _count(counts: tuple[int, int] | None, i: int) -> float | None:
    return None if counts is None else float(counts[i])


def _hit_rate_of(kind: str) -> Callable[[Sequence[Sample]], float | None]:
    return lambda xs: hit_rate([s for s in xs if _kind(s) == kind])


DOC_SPEED = "document prompt tokens/s, over each one's own wait"
DOCS_AT_ONCE = "at once, while any waited for a first token"
"""The document rate is their product: how fast each document went, times how many went at once (`report`)."""


def _of_documents(figure: Callable[[Sequence[Sample]], float | None]) -> Callable[[Sequence[Sample]], float | None]:
    """`figure` (one of `report`'s long-prefill figures) over the documents: the "long" class for the shared
    definition, whatever a front's header said."""
    return lambda xs: figure([replace(s, traffic_class="long" if _kind(s) == "doc" else "other") for s in xs])


# (label, unit, better: "low"/"high"/None, getter)
METRICS: list[tuple[str, str, str | None, Callable[[Sequence[Sample]], float | None]]] = [
    ("chat TTFT p50", "s", "low", lambda xs: pct(_ttfts(xs, "chat"), 50)),
    ("chat TTFT p90", "s", "low", lambda xs: pct(_ttfts(xs, "chat"), 90)),
    ("chat TTFT p99", "s", "low", lambda xs: pct(_ttfts(xs, "chat"), 99)),
    ("chat TTFT max", "s", "low", lambda xs: max(_ttfts(xs, "chat"), default=None)),
    ("chat TTFT p50 inside the app", "s", None, lambda xs: pct(_app_ttfts(xs, "chat"), 50)),
    (IDLE_TTFT_P50, "s", "low", lambda xs: None),  # measured apart, before the load: `Front.idle_ttft_s`
    ("chat ITL p99", "s", "low", lambda xs: pct([g for s in _ok(xs, "chat") for g in s.itl_s], 99)),
    ("chat SLO attainment", "%", "high", _attainment),
    ("document TTFT p50", "s", "low", lambda xs: pct(_ttfts(xs, "doc"), 50)),
    ("document TTFT p99", "s", "low", lambda xs: pct(_ttfts(xs, "doc"), 99)),
    ("document prompt tokens/s", "tok/s", "high", _of_documents(long_prefill_tok_per_s)),
    (DOC_SPEED, "tok/s", "high", _of_documents(long_prefill_tok_per_request_s)),
    (DOCS_AT_ONCE, "documents", None, _of_documents(long_prefills_at_once)),
    ("follow-up TTFT p50", "s", "low", lambda xs: pct(_ttfts(xs, "followup"), 50)),
    ("follow-up TTFT p99", "s", "low", lambda xs: pct(_ttfts(xs, "followup"), 99)),
    ("engine prefix-cache hit rate", "%", "high", hit_rate),
    ("hit rate: chats", "%", "high", _hit_rate_of("chat")),
    ("hit rate: documents", "%", "high", _hit_rate_of("doc")),
    ("hit rate: follow-ups", "%", "high", _hit_rate_of("followup")),
    ("prompt tokens (engines' count)", "", None, lambda xs: _count(cache_counts(xs), 1)),
    ("cached prompt tokens (engines' count)", "", None, lambda xs: _count(cache_counts(xs), 0)),
    ("chats", "", None, lambda xs: float(len(_ok(xs, "chat")))),
    ("documents", "", None, lambda xs: float(len(_ok(xs, "doc")))),
    ("follow-ups", "", None, lambda xs: float(len(_ok(xs, "followup")))),
    ("failures", "", None, lambda xs: float(sum(1 for s in xs if not s.ok and not s.shed))),
    ("shed (429/503)", "", None, lambda xs: float(sum(1 for s in xs if s.shed))),
]


def figures(samples: Sequence[Sample]) -> dict[str, float | None]:
    return {label: get(samples) for label, _, _, get in METRICS}


def best_peer(fronts: Sequence[Front], label: str, better: str) -> float | None:
    values = [v for f in fronts if f.name in PEERS and (v := f.figures[label]) is not None]
    if not values:
        return None
    return min(values) if better == "low" else max(values)


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit in ("tok/s", "") or abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if unit == "%" else f"{v:.3g}"


def ratio(mine: float | None, theirs: float | None) -> str:
    return f"{mine / theirs:.2f}x" if mine is not None and theirs else "—"


def front_cpu_ms(front: Front) -> float | None:
    """The front's CPU milliseconds per request: its cores while the load ran, over the requests answered then."""
    cores = front.cpu_cores.get("front")
    if cores is None or not front.samples:
        return None
    return 1e3 * cores * (front.span_s or 0.0) / len(front.samples)


def pooled(rounds: Sequence[Front]) -> Front:
    """One front's rounds (`loadtests.peers --rounds`) as one result: their samples and idle probes together, the
    cores each role used averaged over the rounds' spans, the load average from the first round's start to the last
    round's end."""
    first, last = rounds[0], rounds[-1]
    spans = [f.span_s or 0.0 for f in rounds]

    def mean_cores(of: Callable[[Front], dict[str, float]]) -> dict[str, float]:
        roles = dict.fromkeys(r for f in rounds for r in of(f))
        out = {}
        for role in roles:
            had = [(of(f)[role], w) for f, w in zip(rounds, spans, strict=True) if role in of(f)]
            total = sum(w for _, w in had)
            out[role] = sum(c * w for c, w in had) / total if total else sum(c for c, _ in had) / len(had)
        return out

    return Front(
        first.name,
        [s for f in rounds for s in f.samples],
        first.start_s,
        first.load_start,
        last.load_end,
        next((f.locust_rc for f in rounds if f.locust_rc), first.locust_rc),
        cpu_cores=mean_cores(lambda f: f.cpu_cores),
        cpu_waiting=mean_cores(lambda f: f.cpu_waiting),
        cpu_by_process=mean_cores(lambda f: f.cpu_by_process),
        cpu_waiting_by_process=mean_cores(lambda f: f.cpu_waiting_by_process),
        kv_pool_tokens=first.kv_pool_tokens,
        idle_ttft_s=[t for f in rounds for t in f.idle_ttft_s],
        span_s=sum(spans),
    )


def table(fronts: Sequence[Front]) -> str:
    head = ["metric", *(f.name for f in fronts), f"{APP} / best peer"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    app = next((f for f in fronts if f.name == APP), None)
    for label, unit, better, _ in METRICS:
        cells = [f"{label} ({unit})" if unit else label, *(_fmt(f.figures[label], unit) for f in fronts)]
        peer = best_peer(fronts, label, better) if better else None
        mine = app.figures[label] if app else None
        cells.append(ratio(mine, peer))
        rows.append("| " + " | ".join(cells) + " |")
    cpu_rows: list[tuple[str, Callable[[Front], dict[str, float]]]] = [
        ("used", lambda f: f.cpu_cores),
        ("waited for", lambda f: f.cpu_waiting),
    ]
    for what, of in cpu_rows:
        for role in dict.fromkeys(r for f in fronts for r in of(f)):
            cells = [f"{of(f)[role]:.2f}" if role in of(f) else "—" for f in fronts]
            rows.append(f"| CPU cores {what}: {role} | " + " | ".join(cells) + " | |")
    if any(f.kv_pool_tokens for f in fronts):
        pools = [" / ".join(f"{t:,}" for t in f.kv_pool_tokens) or "—" for f in fronts]
        rows.append("| KV pool per engine (tokens, sglang's count) | " + " | ".join(pools) + " | |")
    per_request = [front_cpu_ms(f) for f in fronts]
    rows.append("| front CPU ms per request | " + " | ".join(f"{ms:.1f}" if ms else "—" for ms in per_request) + " | |")
    loads = [f"{f.load_start:.1f} → {f.load_end:.1f}" for f in fronts]
    rows.append("| load average (1 min), start → end | " + " | ".join(loads) + " | |")
    return "\n".join(rows)


def verdict(fronts: Sequence[Front]) -> list[str]:
    """The acceptance read from the table: chat TTFT p99 and document rate against the best peer, failures."""
    app = next((f for f in fronts if f.name == APP), None)
    if app is None or not any(f.name in PEERS for f in fronts):
        return ["No verdict: the run needs this app and at least one peer."]
    p99, peer_p99 = app.figures["chat TTFT p99"], best_peer(fronts, "chat TTFT p99", "low")
    rate, peer_rate = app.figures["document prompt tokens/s"], best_peer(fronts, "document prompt tokens/s", "high")
    lines = []
    if p99 is not None and peer_p99:
        ok = p99 <= CHAT_TTFT_P99_RATIO * peer_p99
        lines.append(
            f"- chat TTFT p99 {p99 / peer_p99:.3f}x the best peer's (≤ {CHAT_TTFT_P99_RATIO}x): "
            f"{'met' if ok else 'missed'}"
        )
    if rate is not None and peer_rate:
        ok = rate >= DOC_RATE_RATIO * peer_rate
        lines.append(
            f"- document prompt tokens/s {rate / peer_rate:.3f}x the best peer's (≥ {DOC_RATE_RATIO}x): "
            f"{'met' if ok else 'missed'}"
        )
    failed = [f"{f.name} {f.failures}" for f in fronts if f.failures]
    lines.append(f"- failures: {', '.join(failed) if failed else 'none in any front'}")
    return lines


AS_SHIPPED = (
    "every process at the priority it starts with (as shipped: this app's replicas and HAProxy at the raylet's, by "
    "its config's `RAY_worker_niceness`)"
)
RENICED = (
    "**reniced, not as shipped** (`--renice`): sglang's schedulers (the forward passes) at niceness 15, every other "
    "process at 0"
)


DOCUMENT_USER_COUNT = 2
"""The `sessions` and `documents` workloads' document users (`loadtests.peers.workload_flags` runs this many)."""
CHAT_USER_COUNT = 4
"""The `sessions` workload's chat users."""
DOCUMENT_USERS = f"{DOCUMENT_USER_COUNT} document users (10-14k-token document, one follow-up)"
SESSIONS_WORKLOAD = f"{DOCUMENT_USERS}, {CHAT_USER_COUNT} chat users (20-60-token questions, 16 output tokens)"
"""The default workload (`loadtests.locustfile`'s users, each conversation named by `X-Session-ID`)."""
DOCUMENTS_WORKLOAD = f"{DOCUMENT_USERS}, no chat users"
"""`SESSIONS_WORKLOAD`'s document users alone: what a front costs documents with nothing beside them."""


def markdown(
    fronts: Sequence[Front],
    engine: EngineSettings,
    chars_per_token: float,
    duration_s: float,
    seed: int,
    reniced: bool = False,
    workload: str = SESSIONS_WORKLOAD,
    rounds: int = 1,
) -> str:
    """The settings, the table and the verdict of one workload; `workload`: what its users send, in words;
    `rounds`: the windows each front had, pooled in the table."""
    settings = (
        f"Two CPU sglang 0.5.23 engines per front: context {engine.context_tokens}, chunked prefill "
        f"{engine.chunk_tokens}, max running requests {engine.max_running_requests}, KV {engine.max_total_tokens} "
        f"tokens, cache report on, OMP_NUM_THREADS=1, {RENICED if reniced else AS_SHIPPED}; "
        f"this app's class bound (short_request_tokens) {engine.short_request_tokens}. "
        f"Workload seed {seed}, {_windows(rounds, duration_s)}, "
        f"closed loop: {workload}, think 0.5-1.5 s; {chars_per_token:.2f} characters a token (the model's "
        f"tokenizer). Chat SLO: TTFT ≤ {TTFT_TARGET_S} s and no gap between tokens above {TBT_TARGET_S} s."
    )
    parts = [settings, "", table(fronts), "", "Acceptance:", *verdict(fronts), ""]
    by_process = process_table(fronts)
    if by_process:
        parts += [
            "CPU cores used while the load ran, and waited for where the kernel says, by kind of process "
            "(`loadtests.cpu_share.KINDS`; the rest of the machine's wait is not read):",
            "",
            by_process,
            "",
        ]
    return "\n".join(parts)


SHOWN_CORES = 0.005
"""A kind of process is left out of `process_table` where no front's used as much."""


def process_table(fronts: Sequence[Front]) -> str:
    """Cores used by each kind of process, a column a front (and beside it what the kind waited for a core, where
    the kernel said): the kinds some front used `SHOWN_CORES` of, then the total; empty where no front was sampled by
    kind."""
    kinds = [
        k
        for k in dict.fromkeys(k for f in fronts for k in f.cpu_by_process)
        if any(f.cpu_by_process.get(k, 0.0) >= SHOWN_CORES for f in fronts)
    ]
    if not kinds:
        return ""
    waits = any(f.cpu_waiting_by_process for f in fronts)
    head = [c for f in fronts for c in ([f"{f.name}: used", "waited for"] if waits else [f.name])]
    rows = ["| process | " + " | ".join(head) + " |", "|" + " --- |" * (len(head) + 1)]
    for kind in kinds:
        cells = [
            c
            for f in fronts
            for c in _cells(f.cpu_by_process.get(kind, 0.0), f.cpu_waiting_by_process.get(kind), waits)
        ]
        rows.append(f"| {kind} | " + " | ".join(cells) + " |")
    totals = [
        c for f in fronts for c in _cells(sum(f.cpu_by_process.values()), sum(f.cpu_waiting_by_process.values()), waits)
    ]
    rows.append("| all processes | " + " | ".join(totals) + " |")
    return "\n".join(rows)


def _cells(used: float, waited: float | None, waits: bool) -> list[str]:
    """A front's cells of one row: its cores, and beside them ("—" where not read) its wait, if the table has waits."""
    if not waits:
        return [f"{used:.3f}"]
    return [f"{used:.3f}", "—" if waited is None else f"{waited:.3f}"]


def _windows(rounds: int, duration_s: float) -> str:
    if rounds == 1:
        return f"{duration_s:.0f} s a front"
    return (
        f"{rounds} rounds of {duration_s:.0f} s a front, each front started afresh each round, the fronts' order "
        f"reversed each round; the table pools the rounds"
    )


HEADLINE = (
    "engine prefix-cache hit rate",
    "follow-up TTFT p50",
    "follow-up TTFT p99",
    "chat TTFT p50",
    "chat TTFT p99",
    "document prompt tokens/s",
    DOC_SPEED,
    "failures",
)
"""The figures each workload is summed up by, this app against `REFERENCE`."""
UNITS = {label: unit for label, unit, _, _ in METRICS}


def pool_rounds(rounds: Sequence[Sequence[Front]]) -> list[Front]:
    """Each front of a workload's rounds pooled (`pooled`), in the order the first round ran them."""
    names = dict.fromkeys(f.name for r in rounds for f in r)
    return [pooled([f for r in rounds for f in r if f.name == name]) for name in names]


def _figure(fronts: Sequence[Front], name: str, label: str) -> float | None:
    return next((f.figures[label] for f in fronts if f.name == name), None)


def headline(workloads: Sequence[tuple[str, Sequence[Sequence[Front]]]]) -> str:
    """One row per workload and `HEADLINE` figure: this app's and `REFERENCE`'s over every round, their ratio, and
    the ratio in each round alone (its spread: how far the machine's drift between windows moves it)."""
    head = f"| workload | figure | {APP} | {REFERENCE} | {APP} / {REFERENCE} | each round |"
    rows = [head, "|" + " --- |" * 6]
    for name, rounds in workloads:
        fronts = pool_rounds(rounds)
        for label in HEADLINE:
            unit = UNITS[label]
            mine, theirs = (_figure(fronts, n, label) for n in (APP, REFERENCE))
            each = ", ".join(ratio(_figure(r, APP, label), _figure(r, REFERENCE, label)) for r in rounds)
            figure = f"{label} ({unit})" if unit else label
            rows.append(
                f"| {name} | {figure} | {_fmt(mine, unit)} | {_fmt(theirs, unit)} | {ratio(mine, theirs)} | {each} |"
            )
    return "\n".join(rows)


def plot(fronts: Sequence[Front], path: Path) -> None:
    """Chat TTFT distribution per front, and document prompt tokens/s per front."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax_cdf, ax_doc) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, f in enumerate(fronts):
        xs = sorted(_ttfts(f.samples, "chat"))
        if xs:
            ax_cdf.step(xs, np.linspace(0, 1, len(xs)), where="post", color=f"C{i}", label=f.name)
    ax_cdf.axvline(TTFT_TARGET_S, color="grey", ls=":", lw=1)
    ax_cdf.set(xscale="log", xlabel="chat TTFT (s, log)", ylabel="fraction of chats", title="Chat TTFT CDF")
    if ax_cdf.get_legend_handles_labels()[1]:
        ax_cdf.legend(fontsize=8)
    else:  # a workload of documents alone
        ax_cdf.text(0.5, 0.5, "no chats in this workload", ha="center", va="center", transform=ax_cdf.transAxes)
    rates = [f.figures["document prompt tokens/s"] or 0.0 for f in fronts]
    ax_doc.bar([f.name for f in fronts], rates, color=[f"C{i}" for i in range(len(fronts))])
    ax_doc.set(ylabel="document prompt tokens/s", title="Document prefill throughput")
    for ax in (ax_cdf, ax_doc):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
