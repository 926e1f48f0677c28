"""`python -m scheduler.sim` (also `fairshare-sim`): reproduce the source articles' tables, compare policies,
sweep the pass-size frontier, refit the calibrated preset."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from scheduler.sim.presets import CARD12GB, PRESETS
from scheduler.sim.workload import OVERLOAD_SCENARIOS, SCENARIOS, TENANT_SCENARIOS, load_workload, scenario
from scheduler.slo import SloTargets
from scheduler.traffic import TrafficClass

if TYPE_CHECKING:
    from scheduler.sim.compare import Cell, Comparison

console = Console()


def _fmt(v: float | str | None, digits: int = 3) -> str:
    if v is None:
        return "—"
    return v if isinstance(v, str) else f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:.0f}"


def cmd_reproduce(args: argparse.Namespace) -> int:
    from scheduler.sim.reproduce import reproduce

    rows = reproduce()
    if args.json:
        print(json.dumps({"rows": [{**r.model_dump(exclude={"kind"}), "ok": r.ok} for r in rows]}, indent=2))
        return 0
    table = Table(title="Source-article figures vs simulator (throughput ±5%, TTFT ±25%, steps exact; — = not stated)")
    for col in ("case", "metric", "article", "sim", "ok"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.case, r.metric, _fmt(r.article), _fmt(r.sim), {True: "yes", False: "NO", None: ""}[r.ok])
    console.print(table)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from scheduler.sim.compare import compare, plot

    preset = PRESETS[args.preset]
    workload = load_workload(args.workload) if args.workload else scenario(args.scenario, preset)
    if args.seed is not None:
        workload = workload.model_copy(update={"seed": args.seed})
    chat = SloTargets(ttft_s=args.ttft_target_s or preset.ttft_target_s, tbt_s=args.tbt_target_s or preset.tbt_target_s)
    comparison, results = compare(workload, args.policy, preset, {TrafficClass.SHORT: chat})
    if args.plot:
        plot(results, args.plot)
    if args.json:
        print(comparison.model_dump_json(indent=2))
        return 0
    for cls, metrics in comparison.classes.items():
        table = Table(title=f"{workload.name} on {comparison.preset}: {cls} requests (ratio to {args.policy[0]})")
        table.add_column("metric")
        for spec in args.policy:
            table.add_column(spec, justify="right")
        for label, cells in metrics.items():
            table.add_row(label, *(_cell(cells[s]) for s in args.policy))
        console.print(table)
    if len(next(iter(comparison.tenants.values())).tenants) > 1:
        console.print(_tenant_table(comparison))
    console.print(f"decode-only step: {comparison.decode_only_step_s:.3f} s")
    console.print(
        f"SLO (short requests): TTFT <= {chat.ttft_s:g} s and p99 of each stream's gaps <= {chat.tbt_s:g} s "
        "(scheduler.slo); long requests are not judged on latency"
    )
    return 0


def _tenant_table(comparison: Comparison) -> Table:
    """Per policy and tenant: tokens served, shares while backlogged, TTFT p99; Jain's index and the largest gap."""
    table = Table(title=f"{comparison.workload}: tenants (scheduler.tenants; shares of the prefill while backlogged)")
    columns = ("policy", "tenant", "weight", "tokens served", "share beside others", "share, all waiting", "TTFT p99")
    for col in columns:
        table.add_column(col, justify="left" if col in ("policy", "tenant") else "right")
    for spec, report in comparison.tenants.items():
        for name, t in report.tenants.items():
            shares = (_fmt(t.share_while_backlogged), _fmt(t.share_while_all_backlogged))
            table.add_row(spec, name, _fmt(t.weight), str(t.tokens_served), *shares, _fmt(t.ttft_p99_s))
        gap = report.max_service_gap_tokens
        table.add_row(spec, "Jain, gap", "", "", _fmt(report.jain_while_backlogged), _fmt(gap), "")
    return table


def _cell(c: Cell) -> str:
    if c.value is None:
        return "—"
    return _fmt(c.value) + ("" if c.ratio is None else f" ({c.ratio:.2f}×)")


def cmd_frontier(args: argparse.Namespace) -> int:
    from scheduler.sim.frontier import plot, sweep

    frontier = sweep(PRESETS[args.preset])
    if args.plot:
        plot(frontier, args.plot)
    if args.json:
        print(frontier.model_dump_json(indent=2))
        return 0
    table = Table(title=f"Pass-size frontier on {frontier.preset} (unchunked {frontier.unchunked_tok_per_s:.0f} tok/s)")
    cols = ("policy", "knob", "lone speed", "speed with question", "question TTFT s", "floor s", "TTFT / floor")
    for col in (*cols, "dominated by fairshare"):
        table.add_column(col)
    for p in frontier.points:
        table.add_row(
            p.policy,
            str(p.knob),
            f"{100 * p.lone_fraction:.1f}%",
            f"{100 * p.single_fraction:.1f}%",
            f"{p.short_ttft_s:.3f}",
            f"{p.floor_s:.3f}",
            f"{p.over_floor:.2f}×",
            "yes" if frontier.dominated(p, "fairshare") else "no",
        )
    console.print("floor: half the pass in flight (at the document's context) plus one pass of the question alone")
    console.print(table)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from scheduler.sim.calibration import fit_card12gb

    fit = fit_card12gb()
    print(fit.model_dump_json(indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fairshare-sim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("reproduce", help="each source-article figure next to the simulator's")
    rep.add_argument("--json", action="store_true")
    rep.set_defaults(func=cmd_reproduce)

    cmp_ = sub.add_parser("compare", help="policies side by side on one workload")
    src = cmp_.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--scenario",
        choices=sorted([*SCENARIOS, *OVERLOAD_SCENARIOS, *TENANT_SCENARIOS]),
        help="a named workload (kv-burst, poisson-*, doc-flood are sized for the preset)",
    )
    src.add_argument("--workload", type=_existing_file, help="YAML or JSON workload file")
    cmp_.add_argument(
        "--policy",
        action="append",
        required=True,
        help="rule set, optionally with overrides: fairshare:interactive_pass_tokens=256 (repeat)",
    )
    cmp_.add_argument("--preset", choices=sorted(PRESETS), default=CARD12GB.name)
    cmp_.add_argument(
        "--ttft-target-s", type=_positive_s, help="judge short requests by this TTFT target (default: the preset's)"
    )
    cmp_.add_argument(
        "--tbt-target-s", type=_positive_s, help="judge short streams by this TBT target (default: the preset's)"
    )
    cmp_.add_argument(
        "--seed", type=int, help="draw the workload's random arrivals and sizes from this seed (default: its own)"
    )
    cmp_.add_argument("--json", action="store_true")
    cmp_.add_argument("--plot", type=Path, help="write TTFT/ITL distributions to this PNG")
    cmp_.set_defaults(func=cmd_compare)

    fr = sub.add_parser("frontier", help="sweep pass size: lone-document speed vs question TTFT")
    fr.add_argument("--preset", choices=sorted(PRESETS), default=CARD12GB.name)
    fr.add_argument("--json", action="store_true")
    fr.add_argument("--plot", type=Path)
    fr.set_defaults(func=cmd_frontier)

    cal = sub.add_parser("calibrate", help="refit the card12gb-27b preset to the article's F sweep")
    cal.set_defaults(func=cmd_calibrate)
    return parser


def _positive_s(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"workload file {text!r} does not exist")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
        return status
    except (ValueError, ValidationError) as exc:
        # Bad policy specs and workload files name the offending value; no stack trace for input errors.
        parser.exit(2, f"fairshare-sim: error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
