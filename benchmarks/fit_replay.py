"""Replay engines' measured passes through the online pass-cost fit: how far measured runs from predicted.

A pass trace (``FAIRSHARE_PASS_TRACE``, written by the plugin on a real engine: `scheduler.pass_trace`) holds every
pass the engine timed, with its figures. This replays each engine's passes (one per process id) in order through
`scheduler.pass_cost_fit.OnlinePassCost` as the plugin feeds it: each pass is predicted by the fit in force, then
observed. For the passes with prefill (those the SLO sizer sizes) it prints the quantiles of measured / predicted
(above 1: the pass ran slower than planned, which is what makes a chat late) and the median absolute relative
error, for the fit as built and for variants (`VARIANTS`: without its floor, and without the floor and with the
refits held as they were before), and the first deep chunks a new engine ran.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.results import records
from scheduler.pass_cost_fit import FitSettings, OnlinePassCost
from scheduler.pass_trace import read_pass_timings
from scheduler.slo import gap_quantile_s


class HeldFit(OnlinePassCost):
    """The fit as it was before it refit every pass while young: refits at 8, 16, 31, 61, 121 passes, then every
    `refit_every_passes` (a baseline to compare with, not a rule anything runs)."""

    def refit_interval(self) -> int:
        s = self.settings
        return min(s.refit_every_passes, max(s.min_passes, self.num_window // 2))


VARIANTS: dict[str, Callable[[], OnlinePassCost]] = {
    "as built": OnlinePassCost,
    "no floor": lambda: OnlinePassCost(settings=FitSettings(floor_passes=0)),
    "no floor, held": lambda: HeldFit(settings=FitSettings(floor_passes=0)),
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


def replay(passes: list[dict[str, Any]], make: Callable[[], OnlinePassCost]) -> list[tuple[int, Figures, float, float]]:
    """(index, figures, measured s, predicted s) of each pass with prefill that a fit predicted."""
    fit = make()
    out = []
    for i, record in enumerate(passes):
        figures, measured = figures_of(record), float(record["measured_s"])
        predicted = fit.pass_s(*figures)
        if figures[0] > 0 and not math.isnan(predicted) and predicted > 0:
            out.append((i, figures, measured, predicted))
        fit.observe(*figures, measured)
    return out


Replays = dict[int, dict[str, list[tuple[int, Figures, float, float]]]]
"""engine (pid) -> variant -> `replay` of its passes."""


def replays_of(by_engine: dict[int, list[dict[str, Any]]]) -> Replays:
    return {pid: {name: replay(passes, make) for name, make in VARIANTS.items()} for pid, passes in by_engine.items()}


def table(replays: Replays) -> list[str]:
    head = " | ".join(f"measured/predicted p{round(100 * q)}" for q in QUANTILES)
    lines = [f"engine (pid) | variant | passes with prefill | {head} | max | median abs error", "---|" * 7 + "---"]
    for pid, runs in replays.items():
        for name, rows in runs.items():
            ratios = [m / p for _, _, m, p in rows]
            if not ratios:
                continue
            cells = " | ".join(f"{gap_quantile_s(ratios, q) or 0.0:.2f}" for q in QUANTILES)
            error = statistics.median(abs(r - 1) for r in ratios)
            lines.append(f"{pid} | {name} | {len(ratios)} | {cells} | {max(ratios):.2f} | {error:.1%}")
    return lines


def early(replays: Replays) -> list[str]:
    lines = []
    for pid, runs in replays.items():
        others = {name: {i: p for i, _, _, p in rows} for name, rows in runs.items()}
        for i, figures, measured, _ in runs["as built"]:
            if i < EARLY_PASSES and figures[0] >= EARLY_CHUNK_TOKENS:
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
    print(f"engines: {len(by_engine)}; fit settings as built: {FitSettings()}")
    print("variants: as built; no floor (floor_passes=0); no floor, held (no floor, and refits at 8, 16, 31, 61, 121")
    print("passes then every 64, as before the fit refit every pass while young)")
    print()
    replays = replays_of(by_engine)
    print("\n".join(table(replays)))
    print(f"\nA new engine's first chunks of {EARLY_CHUNK_TOKENS}+ tokens (its first {EARLY_PASSES} passes):")
    print("\n".join(early(replays)) or "none")


if __name__ == "__main__":
    main()
