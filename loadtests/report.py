"""Figures of a load-test run, from client samples (served runs and the simulator's prediction alike).

Times are engine seconds: a served run's wall times are divided by the deployment's time scale.
Long-document prefill throughput, measured the way a client can: uncached prompt tokens of the long
requests / the time during which at least one of them was between its send and its first token.
SLO attainment and goodput of the short requests (`scheduler.slo`), judged by the targets of the policy the
replica ran (`Run.slo`): every short request sent counts, so one shed or failed has missed its SLO.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from loadtests.recording import Sample
from loadtests.stages import Stage, stage_index
from scheduler.slo import NOT_JUDGED, Attainment, SloTargets, attainment, meets_slo


@dataclass(frozen=True)
class Run:
    label: str
    samples: list[Sample]
    """`sent_at_s` and every duration in engine seconds, `sent_at_s` from the start of the run."""
    policy: str = ""
    """Runs of one policy (served and simulated) share a colour in the plot."""
    simulated: bool = False
    slo: SloTargets = NOT_JUDGED
    """The short requests' targets: the policy's interactive ones (`slo_of`)."""


def slo_of(policy: dict) -> SloTargets:
    """The interactive targets of a replica's policy, as its admin view shows it (`PolicyConfig` fields)."""
    return SloTargets(ttft_s=policy.get("ttft_target_s"), tbt_s=policy.get("tbt_target_s"))


def to_engine_time(samples: Sequence[Sample], start_at_s: float, time_scale: float) -> list[Sample]:
    """Served samples (epoch send times, wall durations) in engine seconds from the run's start."""
    k = 1.0 / time_scale
    out = []
    for s in samples:
        out.append(
            Sample(
                **{
                    **s.__dict__,
                    "sent_at_s": (s.sent_at_s - start_at_s) * k,
                    "ttft_s": None if s.ttft_s is None else s.ttft_s * k,
                    "e2e_s": None if s.e2e_s is None else s.e2e_s * k,
                    "itl_s": [g * k for g in s.itl_s],
                }
            )
        )
    return out


def pct(xs: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(xs), q)) if len(xs) else None


def ok(samples: Sequence[Sample], cls: str) -> list[Sample]:
    return [s for s in samples if s.ok and s.traffic_class == cls]


def _long_prefills(samples: Sequence[Sample]) -> tuple[int, float, float]:
    """The long requests' uncached prompt tokens, the sum of their send-to-first-token spans, and the time during
    which at least one of them was in such a span (each moment counted once)."""
    done = [s for s in ok(samples, "long") if s.ttft_s is not None]
    spans = sorted((s.sent_at_s, s.sent_at_s + s.ttft_s) for s in done if s.ttft_s is not None)
    busy, end = 0.0, -np.inf
    for a, b in spans:
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    tokens = sum((s.prompt_tokens or 0) - (s.cached_tokens or 0) for s in done)
    return tokens, sum(b - a for a, b in spans), busy


def long_prefill_tok_per_s(samples: Sequence[Sample]) -> float | None:
    """Long prompts' uncached tokens over the time at least one was waiting for its first token: the product of
    `long_prefill_tok_per_request_s` and `long_prefills_at_once`."""
    tokens, _, busy = _long_prefills(samples)
    return tokens / busy if busy > 0 else None


def long_prefill_tok_per_request_s(samples: Sequence[Sample]) -> float | None:
    """The same tokens over the sum of each request's own wait for its first token: how fast one long prompt went,
    whatever else was in flight beside it."""
    tokens, spans, _ = _long_prefills(samples)
    return tokens / spans if spans > 0 else None


def long_prefills_at_once(samples: Sequence[Sample]) -> float | None:
    """How many long requests were waiting for their first token at once, on average over the time any was. In a
    closed loop of a few users it follows when their requests happen to meet, which moves the throughput with it."""
    _, spans, busy = _long_prefills(samples)
    return spans / busy if busy > 0 else None


# (row label, unit, getter over a run's samples)
METRICS: list[tuple[str, str, Callable[[Sequence[Sample]], float | None]]] = [
    ("short TTFT p50", "s", lambda xs: pct([s.ttft_s for s in ok(xs, "short") if s.ttft_s is not None], 50)),
    ("short TTFT p99", "s", lambda xs: pct([s.ttft_s for s in ok(xs, "short") if s.ttft_s is not None], 99)),
    ("long TTFT p50", "s", lambda xs: pct([s.ttft_s for s in ok(xs, "long") if s.ttft_s is not None], 50)),
    ("long prefill throughput", "tok/s", long_prefill_tok_per_s),
    ("short ITL p50", "s", lambda xs: pct([g for s in ok(xs, "short") for g in s.itl_s], 50)),
    ("short ITL p99", "s", lambda xs: pct([g for s in ok(xs, "short") for g in s.itl_s], 99)),
    ("long ITL p99", "s", lambda xs: pct([g for s in ok(xs, "long") for g in s.itl_s], 99)),
    ("short E2E p50", "s", lambda xs: pct([s.e2e_s for s in ok(xs, "short") if s.e2e_s is not None], 50)),
    ("long E2E p50", "s", lambda xs: pct([s.e2e_s for s in ok(xs, "long") if s.e2e_s is not None], 50)),
    ("short requests", "", lambda xs: float(len(ok(xs, "short")))),
    ("long requests", "", lambda xs: float(len(ok(xs, "long")))),
    ("failures", "", lambda xs: float(sum(1 for s in xs if not s.ok and not s.shed))),
    ("shed (429/503)", "", lambda xs: float(sum(1 for s in xs if s.shed))),
]


def short_attainment(samples: Sequence[Sample], slo: SloTargets) -> Attainment | None:
    """Attainment and goodput of every short request sent (`scheduler.slo`), over the run's span; None when the
    targets judge nothing."""
    if slo.ttft_s is None and slo.tbt_s is None:
        return None
    shorts = [s for s in samples if s.traffic_class == "short"]
    met = (meets_slo(slo, s.ttft_s if s.ok else None, s.itl_s if s.ok else ()) for s in shorts)
    span = max((s.sent_at_s + (s.e2e_s or 0.0) for s in samples), default=0.0)
    return attainment(met, span)


SLO_METRICS: list[tuple[str, str, Callable[[Sequence[Sample], SloTargets], float | None]]] = [
    (
        "short SLO attainment",
        "%",
        lambda xs, slo: None if (a := short_attainment(xs, slo)) is None or a.fraction is None else 100 * a.fraction,
    ),
    ("short goodput", "req/s", lambda xs, slo: None if (a := short_attainment(xs, slo)) is None else a.goodput_per_s),
]
"""Rows judged by the run's targets."""


def rows() -> list[tuple[str, str]]:
    """(label, unit) of every figure, in table order."""
    return [(label, unit) for label, unit, _ in (*METRICS, *SLO_METRICS)]


def figures(samples: Sequence[Sample], slo: SloTargets = NOT_JUDGED) -> dict[str, float | None]:
    judged = {label: get(samples, slo) for label, _, get in SLO_METRICS}
    return {label: get(samples) for label, _, get in METRICS} | judged


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "—"
    if unit == "tok/s" or (unit == "" and float(v).is_integer()):
        return f"{v:,.0f}"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"


def per_stage_short_ttft_p99(samples: Sequence[Sample], stages: Sequence[Stage]) -> list[tuple[str, int, float | None]]:
    """(stage, requests, short TTFT p99) by the stage in which each short request was sent: users vs p99."""
    by: dict[int, list[float]] = {}
    for s in ok(samples, "short"):
        i = stage_index(stages, s.sent_at_s)
        if i is not None and s.ttft_s is not None:
            by.setdefault(i, []).append(s.ttft_s)
    return [(st.label, len(by.get(i, [])), pct(by.get(i, []), 99)) for i, st in enumerate(stages) if i in by]


def plot(runs: Sequence[Run], path) -> None:
    """Short TTFT over the run (one dot a request) and the short TTFT distribution, one colour per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_cdf) = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = {p: f"C{i}" for i, p in enumerate(dict.fromkeys(r.policy or r.label for r in runs))}
    for run in runs:
        shorts = [s for s in ok(run.samples, "short") if s.ttft_s is not None]
        if not shorts:
            continue
        colour = colours[run.policy or run.label]
        marker, line = ("x", "--") if run.simulated else (".", "-")
        xs, ys = [s.sent_at_s for s in shorts], [s.ttft_s for s in shorts]
        ax_t.plot(xs, ys, marker, color=colour, ms=4, label=run.label)
        if not run.simulated:
            for s in ok(run.samples, "long"):
                if s.ttft_s is not None:
                    ax_t.axvspan(s.sent_at_s, s.sent_at_s + s.ttft_s, color=colour, alpha=0.06)
        xs = sorted(s.ttft_s for s in shorts)
        ax_cdf.step(xs, np.linspace(0, 1, len(xs)), line, where="post", color=colour, label=run.label)
    ax_t.set(yscale="log", xlabel="send time (engine s)", ylabel="short TTFT (s, log)", title="Short TTFT over the run")
    note = "shaded: a served document between send and first token; x: simulated"
    ax_t.text(0.01, 0.98, note, transform=ax_t.transAxes, va="top", fontsize=7)
    ax_cdf.set(xscale="log", xlabel="short TTFT (s, log)", ylabel="fraction of requests", title="Short TTFT CDF")
    for ax in (ax_t, ax_cdf):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
