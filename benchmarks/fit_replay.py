"""Replay engines' measured passes through the online pass-cost fit: how far measured runs from predicted.

A pass trace (``FAIRSHARE_PASS_TRACE``, written by the plugin on a real engine: `scheduler.pass_trace`) holds every
pass the engine timed, with its figures. This replays each engine's passes (one per process id) in order through
`scheduler.pass_cost_fit.OnlinePassCost` as the plugin feeds it: each pass is predicted by the fit in force, then
observed. For the passes with prefill (those the SLO sizer sizes) it prints the quantiles of measured / predicted
(above 1: the pass ran slower than planned, which is what makes a chat late) and the median absolute relative
error, for the fit as built and for variants (`VARIANTS`), and the first deep chunks a new engine ran.

The trace's passes were sized by the fit that ran, so a variant is judged on the passes the built fit chose, not on
those it would have chosen itself.

    FAIRSHARE_PASS_TRACE=/tmp/trace.jsonl python -m loadtests.peers --fronts fairshare ...   # makes a trace
    python -m benchmarks.fit_replay /tmp/trace.jsonl [--source "the command that made it"]
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.results import records
from scheduler.pass_cost_fit import FitSettings, OnlinePassCost
from scheduler.pass_trace import read_pass_timings

VARIANTS = {
    "as built": FitSettings(),
    "no floor": FitSettings(floor_passes=0),
}
QUANTILES = (0.5, 0.9, 0.99)
EARLY_PASSES = 24
"""A new engine's first passes, listed when they carry a chunk of at least `EARLY_CHUNK_TOKENS`."""
EARLY_CHUNK_TOKENS = 1024

Figures = tuple[int, float, int, int]


def figures_of(record: dict[str, Any]) -> Figures:
    return (
        int(record["prefill_tokens"]),
        float(record["prefill_ctx_pairs"]),
        int(record["decode_rows"]),
        int(record["decode_ctx_tokens"]),
    )


def replay(passes: list[dict[str, Any]], settings: FitSettings) -> list[tuple[int, Figures, float, float]]:
    """(index, figures, measured s, predicted s) of each pass with prefill that a fit predicted."""
    fit = OnlinePassCost(settings=settings)
    out = []
    for i, record in enumerate(passes):
        figures, measured = figures_of(record), float(record["measured_s"])
        predicted = fit.pass_s(*figures)
        if figures[0] > 0 and not math.isnan(predicted) and predicted > 0:
            out.append((i, figures, measured, predicted))
        fit.observe(*figures, measured)
    return out


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def table(by_engine: dict[int, list[dict[str, Any]]]) -> list[str]:
    head = " | ".join(f"measured/predicted p{round(100 * q)}" for q in QUANTILES)
    lines = [f"engine (pid) | variant | passes with prefill | {head} | max | median abs error", "---|" * 7 + "---"]
    for pid, passes in by_engine.items():
        for name, settings in VARIANTS.items():
            ratios = [m / p for _, _, m, p in replay(passes, settings)]
            if not ratios:
                continue
            cells = " | ".join(f"{quantile(ratios, q):.2f}" for q in QUANTILES)
            error = statistics.median(abs(r - 1) for r in ratios)
            lines.append(f"{pid} | {name} | {len(ratios)} | {cells} | {max(ratios):.2f} | {error:.1%}")
    return lines


def early(by_engine: dict[int, list[dict[str, Any]]]) -> list[str]:
    lines = []
    for pid, passes in by_engine.items():
        runs = {name: replay(passes[:EARLY_PASSES], s) for name, s in VARIANTS.items()}
        built = runs["as built"]
        others = {name: {i: p for i, _, _, p in rows} for name, rows in runs.items()}
        for i, figures, measured, _ in built:
            if figures[0] >= EARLY_CHUNK_TOKENS:
                predicted = ", ".join(f"{name} {others[name][i]:.3f} s" for name in VARIANTS if i in others[name])
                lines.append(
                    f"{pid} pass {i}: {figures[0]} tokens, {figures[1]:.3g} pairs, measured {measured:.3f} s; "
                    f"predicted: {predicted}"
                )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path, nargs="+", help="pass-trace files (JSON lines)")
    parser.add_argument("--source", default="", help="how the traces were made (printed in the result)")
    args = parser.parse_args(argv)
    for path in args.trace:
        if not path.is_file():
            parser.error(f"no trace file at {path}")
    record(args.trace, args.source)


@records("fit-replay", "Engines' measured passes replayed through the online pass-cost fit")
def record(traces: list[Path], source: str) -> None:
    by_engine: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for path in traces:
        for r in read_pass_timings(path):
            by_engine[int(r.get("pid", 0))].append(r)
    print(f"traces: {', '.join(str(p) for p in traces)}" + (f" ({source})" if source else ""))
    print(f"engines: {len(by_engine)}; variants: " + "; ".join(f"{n}: {s}" for n, s in VARIANTS.items()))
    print()
    print("\n".join(table(by_engine)))
    print(f"\nA new engine's first chunks of {EARLY_CHUNK_TOKENS}+ tokens (its first {EARLY_PASSES} passes):")
    print("\n".join(early(by_engine)) or "none")


if __name__ == "__main__":
    main()
