"""Figures of the peer benchmark (`loadtests.peers`): one column per front, this app's ratio to the best peer.

Requests are told apart by who sent them, the same way for every front (a stock sglang server says nothing of
traffic classes): chats (chat users), documents (a document user's first request on a document) and follow-ups
(its question on that document). Document prompt tokens/s: the documents' prompt tokens (less any reported as
cached) over the time during which at least one document was between its send and its first token, as
`report.long_prefill_tok_per_s` measures it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from loadtests.recording import Sample
from loadtests.report import long_prefill_tok_per_s, pct

PEERS = ("cache_aware", "round_robin")
"""The fronts this app is judged against (`sglang-router` in front of stock sglang)."""
APP = "fairshare"
TTFT_TARGET_S = 0.5
TBT_TARGET_S = 0.3
"""The SLO's defaults: a chat meets it when its first token comes within TTFT_TARGET_S and no gap between its
tokens exceeds TBT_TARGET_S."""
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

    def __post_init__(self) -> None:
        self.figures = figures(self.samples)

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


def meets_slo(s: Sample) -> bool:
    return s.ttft_s is not None and s.ttft_s <= TTFT_TARGET_S and all(g <= TBT_TARGET_S for g in s.itl_s)


def _attainment(samples: Sequence[Sample]) -> float | None:
    chats = [s for s in samples if _kind(s) == "chat" and not s.shed]
    return 100.0 * sum(1 for s in chats if s.ok and meets_slo(s)) / len(chats) if chats else None


def _doc_rate(samples: Sequence[Sample]) -> float | None:
    # Documents as the "long" class for the shared definition, whatever a front's header said.
    return long_prefill_tok_per_s([replace(s, traffic_class="long" if _kind(s) == "doc" else "other") for s in samples])


# (label, unit, better: "low"/"high"/None, getter)
METRICS: list[tuple[str, str, str | None, Callable[[Sequence[Sample]], float | None]]] = [
    ("chat TTFT p50", "s", "low", lambda xs: pct(_ttfts(xs, "chat"), 50)),
    ("chat TTFT p90", "s", "low", lambda xs: pct(_ttfts(xs, "chat"), 90)),
    ("chat TTFT p99", "s", "low", lambda xs: pct(_ttfts(xs, "chat"), 99)),
    ("chat TTFT max", "s", "low", lambda xs: max(_ttfts(xs, "chat"), default=None)),
    ("chat ITL p99", "s", "low", lambda xs: pct([g for s in _ok(xs, "chat") for g in s.itl_s], 99)),
    ("chat SLO attainment", "%", "high", _attainment),
    ("document TTFT p50", "s", "low", lambda xs: pct(_ttfts(xs, "doc"), 50)),
    ("document TTFT p99", "s", "low", lambda xs: pct(_ttfts(xs, "doc"), 99)),
    ("document prompt tokens/s", "tok/s", "high", _doc_rate),
    ("follow-up TTFT p50", "s", "low", lambda xs: pct(_ttfts(xs, "followup"), 50)),
    ("follow-up TTFT p99", "s", "low", lambda xs: pct(_ttfts(xs, "followup"), 99)),
    ("chats", "", None, lambda xs: float(len(_ok(xs, "chat")))),
    ("documents", "", None, lambda xs: float(len(_ok(xs, "doc")))),
    ("follow-ups", "", None, lambda xs: float(len(_ok(xs, "followup")))),
    ("failures", "", None, lambda xs: float(sum(1 for s in xs if not s.ok and not s.shed))),
    ("shed (429/503)", "", None, lambda xs: float(sum(1 for s in xs if s.shed))),
]


def figures(samples: Sequence[Sample]) -> dict[str, float | None]:
    return {label: get(samples) for label, _, _, get in METRICS}


def best_peer(fronts: Sequence[Front], label: str, better: str) -> float | None:
    values = [f.figures[label] for f in fronts if f.name in PEERS and f.figures[label] is not None]
    if not values:
        return None
    return min(values) if better == "low" else max(values)


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit in ("tok/s", "") or abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if unit == "%" else f"{v:.3g}"


def front_cpu_ms(front: Front) -> float | None:
    """The front's CPU milliseconds per request: its cores while the load ran, over the requests answered then."""
    cores = front.cpu_cores.get("front")
    if cores is None or not front.samples:
        return None
    span_s = max(s.sent_at_s + (s.e2e_s or 0.0) for s in front.samples) - min(s.sent_at_s for s in front.samples)
    return 1e3 * cores * span_s / len(front.samples)


def table(fronts: Sequence[Front]) -> str:
    head = ["metric", *(f.name for f in fronts), f"{APP} / best peer"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    app = next((f for f in fronts if f.name == APP), None)
    for label, unit, better, _ in METRICS:
        cells = [f"{label} ({unit})" if unit else label, *(_fmt(f.figures[label], unit) for f in fronts)]
        peer = best_peer(fronts, label, better) if better else None
        mine = app.figures[label] if app else None
        cells.append(f"{mine / peer:.2f}x" if mine is not None and peer else "—")
        rows.append("| " + " | ".join(cells) + " |")
    cpu_rows: list[tuple[str, Callable[[Front], dict[str, float]]]] = [
        ("used", lambda f: f.cpu_cores),
        ("waited for", lambda f: f.cpu_waiting),
    ]
    for what, of in cpu_rows:
        for role in dict.fromkeys(r for f in fronts for r in of(f)):
            cells = [f"{of(f)[role]:.2f}" if role in of(f) else "—" for f in fronts]
            rows.append(f"| CPU cores {what}: {role} | " + " | ".join(cells) + " | |")
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


AS_SHIPPED = "every process at the priority it starts with (as shipped: Ray's workers at niceness 15, the rest at 0)"
RENICED = (
    "**reniced, not as shipped** (`--renice`): sglang's schedulers (the forward passes) at niceness 15, every other "
    "process at 0"
)


def markdown(
    fronts: Sequence[Front], engine, chars_per_token: float, duration_s: float, seed: int, reniced: bool = False
) -> str:
    settings = (
        f"Two CPU sglang 0.5.23 engines per front: context {engine.context_tokens}, chunked prefill "
        f"{engine.chunk_tokens}, max running requests {engine.max_running_requests}, KV {engine.max_total_tokens} "
        f"tokens, cache report on, OMP_NUM_THREADS=1, {RENICED if reniced else AS_SHIPPED}; "
        f"this app's class bound (short_request_tokens) {engine.short_request_tokens}. "
        f"Workload seed {seed}, {duration_s:.0f} s a front, "
        f"closed loop: "
        f"2 document users (10-14k-token document, one follow-up), 4 chat users (20-60-token questions, 16 output "
        f"tokens), think 0.5-1.5 s; {chars_per_token:.2f} characters a token (the model's tokenizer). Chat SLO: TTFT "
        f"≤ {TTFT_TARGET_S} s and no gap between tokens above {TBT_TARGET_S} s."
    )
    return "\n".join([settings, "", table(fronts), "", "Acceptance:", *verdict(fronts), ""])


def plot(fronts: Sequence[Front], path) -> None:
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
    ax_cdf.legend(fontsize=8)
    rates = [f.figures["document prompt tokens/s"] or 0.0 for f in fronts]
    ax_doc.bar([f.name for f in fronts], rates, color=[f"C{i}" for i in range(len(fronts))])
    ax_doc.set(ylabel="document prompt tokens/s", title="Document prefill throughput")
    for ax in (ax_cdf, ax_doc):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
