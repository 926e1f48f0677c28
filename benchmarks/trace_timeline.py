"""Where a document's prefill time goes on its engine, from a pass trace.

A pass trace (``FAIRSHARE_PASS_TRACE``: `scheduler.pass_trace`) holds each engine's plans (who got how many tokens,
what sized the pass) and its timed passes (launch to landing). This lines them up by forward pass and, for each
document (a request granted at least `DOC_TOKENS` prefill tokens in all), splits the wall time from the start of its
first granted pass to the end of its last into: the passes that carried some of it, by what sized them
(`scheduler.slo_sizing.SizedBy`); the passes between them that carried none of it, by the same; and the gaps, when
the engine ran no timed pass at all (scheduling between passes, or the engine process not running). It also prints
the quantiles of the gaps before every pass that follows another within `BUSY_GAP_S`, per engine, and the documents'
prefill rate by how deep into the document a chunk starts (`rate_by_depth`), which reads a stock engine's trace too
(`python -m loadtests.peers` writes one for the `sglang-router` fronts' servers when `FAIRSHARE_PASS_TRACE` is set).

    python -m benchmarks.trace_timeline TRACE.jsonl [--source "the command that made it"]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.results import records
from scheduler.pass_trace import read_pass_timings, read_pass_trace

DOC_TOKENS = 8000
"""Prefill tokens granted to a request in all that make it a document here."""
DEPTHS = (0, 2000, 5000, 8000, 1 << 30)
"""Bands of how deep into its document a chunk starts (tokens): deeper chunks attend to more."""
BUSY_GAP_S = 0.5
"""A gap longer than this between two passes is the engine waiting for work, not a pause inside busy work."""
GAP = "gaps (no timed pass)"


@dataclass
class Engine:
    plans: dict[int, dict[str, Any]] = field(default_factory=dict)
    timed: dict[int, dict[str, Any]] = field(default_factory=dict)


def read(path: Path) -> dict[int, Engine]:
    engines: dict[int, Engine] = defaultdict(Engine)
    for record in read_pass_timings(path):
        engines[int(record.get("pid", 0))].timed[int(record["timed_pass"])] = record
    for record in read_pass_trace(path):
        if "forward_pass" in record and record.get("grants"):
            engines[int(record.get("pid", 0))].plans[int(record["forward_pass"])] = record
    return engines


def documents(engine: Engine) -> list[str]:
    granted: Counter[str] = Counter()
    for plan in engine.plans.values():
        for rid, tokens, _ in plan["grants"]:
            granted[rid] += tokens
    return [rid for rid, tokens in granted.items() if tokens >= DOC_TOKENS]


def split(engine: Engine, rid: str) -> tuple[float, Counter[str]] | None:
    """(wall seconds, seconds by kind) of one document's prefill on `engine`; None where its passes were not timed."""
    mine = sorted(i for i, plan in engine.plans.items() if any(g[0] == rid for g in plan["grants"]))
    first, last = engine.timed.get(mine[0]), engine.timed.get(mine[-1])
    if first is None or last is None:
        return None
    by: Counter[str] = Counter()
    for i in range(mine[0], mine[-1] + 1):
        plan, timed = engine.plans.get(i), engine.timed.get(i)
        if timed is None:
            continue
        if plan is None:
            by["other: decode"] += timed["measured_s"]
            continue
        carried = any(g[0] == rid and g[1] > 0 for g in plan["grants"])
        by[("its own: " if carried else "other: ") + str(plan.get("sized_by"))] += timed["measured_s"]
    wall = last["at"] - (first["at"] - first["measured_s"])
    by[GAP] = max(0.0, wall - sum(by.values()))
    return wall, by


def rate_by_depth(engine: Engine) -> dict[tuple[int, int], tuple[int, float]]:
    """Per `DEPTHS` band: the document tokens of the passes that carried one document alone, starting that deep into
    it, and the wall seconds from each such pass's plan to the engine's next (the pass, whatever ran before the next
    prefill plan, and the gaps). Plans only, so it reads a stock engine's trace (the plugin off) as well."""
    rids = set(documents(engine))
    order = sorted(engine.plans)
    done: Counter[str] = Counter()
    bands: dict[tuple[int, int], tuple[int, float]] = {}
    for i, j in itertools.pairwise(order):
        plan = engine.plans[i]
        grants = [(g[0], g[1]) for g in plan["grants"] if g[1] > 0]
        for rid, tokens in grants:
            depth, done[rid] = done[rid], done[rid] + tokens
            if len(grants) == 1 and rid in rids:
                band = next(b for b in itertools.pairwise(DEPTHS) if depth < b[1])
                seen, wall = bands.get(band, (0, 0.0))
                bands[band] = (seen + tokens, wall + engine.plans[j]["at"] - plan["at"])
    return bands


def gap_quantiles(engine: Engine) -> list[float]:
    timed = [engine.timed[i] for i in sorted(engine.timed)]
    gaps = [b["at"] - b["measured_s"] - a["at"] for a, b in itertools.pairwise(timed)]
    busy = sorted(g for g in gaps if 0 <= g < BUSY_GAP_S)
    return [busy[min(len(busy) - 1, int(q * len(busy)))] for q in (0.5, 0.9, 0.99)] if busy else []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path, help="a pass-trace file (JSON lines)")
    parser.add_argument("--source", default="", help="how the trace was made (printed in the result)")
    args = parser.parse_args(argv)
    if not args.trace.is_file():
        parser.error(f"no trace file at {args.trace}")
    record(args.trace, args.source)


@records("trace-timeline", "Where a document's prefill time goes on its engine (a pass trace)")
def record(trace: Path, source: str) -> None:
    engines = read(trace)
    print(f"trace: {trace}" + (f" ({source})" if source else ""))
    print(f"\nGaps before a pass that follows another within {BUSY_GAP_S} s (ms): p50 / p90 / p99")
    for pid, engine in engines.items():
        q = gap_quantiles(engine)
        print(f"engine {pid}: " + (" / ".join(f"{1e3 * v:.1f}" for v in q) if q else "no passes"))
    print("\nDocument prefill by depth (passes carrying one document alone; plan to the engine's next plan)")
    print("engine | depth (tokens) | tokens | tokens/s")
    print("---|---|---|---")
    for pid, engine in engines.items():
        for (lo, hi), (tokens, wall) in sorted(rate_by_depth(engine).items()):
            band = f"{lo}-{hi}" if hi < DEPTHS[-1] else f"{lo}+"
            print(f"{pid} | {band} | {tokens} | {tokens / wall:.0f}" if wall > 0 else f"{pid} | {band} | {tokens} | -")
    splits = [s for engine in engines.values() for rid in documents(engine) if (s := split(engine, rid))]
    if not splits:
        print("\nno timed passes of documents (a stock engine's trace)")
        return
    walls = [w for w, _ in splits]
    total: Counter[str] = Counter()
    for _, by in splits:
        total.update(by)
    print(
        f"\n{len(splits)} documents; from the start of the first pass carrying one to the end of its last: median "
        f"{statistics.median(walls):.2f} s"
    )
    print("where that time went | seconds per document | share")
    print("---|---|---")
    for kind, seconds in total.most_common():
        print(f"{kind} | {seconds / len(splits):.3f} | {seconds / sum(walls):.1%}")


if __name__ == "__main__":
    main()
