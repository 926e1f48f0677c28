"""The policy under overload: short requests among long documents, on the simulator.

For each overload scenario (sized for the preset: `python -m scheduler.sim compare --scenario NAME`) and
each rule set, the workload runs twice, as is and with its long documents removed; a short request's
*added wait* is its TTFT with the documents less its TTFT without them. The table gives added wait p99/max
in interactive passes of the preset (a pass in flight cannot be interrupted: the floor is about one), short
TTFT p50/p99/max, short-stream time between tokens p99 (seconds and decode-only steps), the short requests'
SLO attainment and goodput (`scheduler.slo`, judged by the preset's interactive targets for every policy), long
prefill throughput relative to `baseline` and long TTFT p99 (the price paid). Writes a PNG of added wait and
throughput, and a result file under docs/results/overload/ (`harness.results`).

    python -m benchmarks.overload [--preset h100-8b --preset card12gb-27b] [--plot docs/overload.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from harness.results import recording
from scheduler.sim.experiments import added_waits
from scheduler.sim.metrics import measure
from scheduler.sim.presets import CARD12GB, H100_8B, PRESETS
from scheduler.sim.workload import OVERLOAD_SCENARIOS, scenario

POLICIES = ["baseline", "vllm", "article-patch", "fairshare"]
SCENARIOS = [*OVERLOAD_SCENARIOS, "mixed-poisson"]


class Row(BaseModel):
    preset: str
    scenario: str
    policy: str
    added_p99_passes: float
    added_max_passes: float
    ttft_p50_s: float
    ttft_p99_s: float
    ttft_max_s: float
    tbt_p99_s: float | None
    itl_p99_steps: float | None
    slo_attainment: float | None
    goodput_per_s: float | None
    long_tok_per_s: float | None
    long_vs_baseline: float | None = None
    long_ttft_p99_s: float | None


def measure_row(preset_name: str, name: str, policy: str) -> Row:
    preset = PRESETS[preset_name]
    result, added = added_waits(scenario(name, preset), policy, preset)
    m = measure(result)
    short, long_ = m.classes["short"], m.classes.get("long")
    unit = preset.interactive_pass_s()
    return Row(
        preset=preset_name,
        scenario=name,
        policy=policy,
        added_p99_passes=float(np.percentile(added, 99)) / unit,
        added_max_passes=max(added) / unit,
        ttft_p50_s=short.ttft_s.p50,
        ttft_p99_s=short.ttft_s.p99,
        ttft_max_s=short.ttft_s.max,
        tbt_p99_s=short.itl_s.p99,
        itl_p99_steps=None if short.itl_s.p99 is None else short.itl_s.p99 / m.decode_only_step_s,
        slo_attainment=short.slo_attainment,
        goodput_per_s=short.goodput_per_s,
        long_tok_per_s=None if long_ is None else long_.long_prefill_tok_per_s,
        long_ttft_p99_s=None if long_ is None else long_.ttft_s.p99,
    )


def run_all(presets: list[str]) -> list[Row]:
    jobs = [(p, s, pol) for p in presets for s in SCENARIOS for pol in POLICIES]
    rows = [measure_row(*job) for job in tqdm(jobs, unit="run", desc="overload")]
    base = {(r.preset, r.scenario): r.long_tok_per_s for r in rows if r.policy == "baseline"}
    for r in rows:
        b = base.get((r.preset, r.scenario))
        if b and r.long_tok_per_s:
            r.long_vs_baseline = r.long_tok_per_s / b
    return rows


def _f(v: float | None, digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}g}"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.1f}%"


COLUMNS = [
    "scenario",
    "policy",
    "added p99 / max (passes)",
    "TTFT p50 / p99 / max s",
    "TBT p99 s (steps)",
    "SLO attainment",
    "goodput req/s",
    "long tok/s (× baseline)",
    "long TTFT p99 s",
]


def cells(r: Row) -> list[str]:
    return [
        r.scenario,
        r.policy,
        f"{_f(r.added_p99_passes)} / {_f(r.added_max_passes)}",
        f"{_f(r.ttft_p50_s)} / {_f(r.ttft_p99_s)} / {_f(r.ttft_max_s)}",
        f"{_f(r.tbt_p99_s)} ({_f(r.itl_p99_steps)})",
        _pct(r.slo_attainment),
        _f(r.goodput_per_s),
        f"{_f(r.long_tok_per_s, 4)} ({_f(r.long_vs_baseline)}×)",
        _f(r.long_ttft_p99_s),
    ]


def heading(preset: str) -> str:
    p = PRESETS[preset]
    return (
        f"{preset}: SLO TTFT ≤ {p.ttft_target_s:g} s, TBT p99 ≤ {p.tbt_target_s:g} s; interactive pass "
        f"{p.interactive_pass_tokens} tokens = {p.interactive_pass_s():.3f} s, decode-only step {p.decode_step_s:.3f} s"
    )


def print_table(rows: list[Row], console: Console) -> None:
    for preset in dict.fromkeys(r.preset for r in rows):
        table = Table(title=heading(preset))
        for c in COLUMNS:
            table.add_column(c, justify="right")
        for r in rows:
            if r.preset == preset:
                table.add_row(*cells(r))
        console.print(table)


def markdown(rows: list[Row]) -> str:
    out = []
    for preset in dict.fromkeys(r.preset for r in rows):
        out += [f"## {heading(preset)}", "", "| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
        out += ["| " + " | ".join(cells(r)) + " |" for r in rows if r.preset == preset]
        out.append("")
    return "\n".join(out)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = list(dict.fromkeys(r.preset for r in rows))
    fig, axes = plt.subplots(len(presets), 2, figsize=(13, 4 * len(presets)), squeeze=False)
    width = 0.8 / len(POLICIES)
    x = np.arange(len(SCENARIOS))
    for (ax_wait, ax_tput), preset in zip(axes, presets, strict=True):
        for k, policy in enumerate(POLICIES):
            mine = {r.scenario: r for r in rows if r.preset == preset and r.policy == policy}
            waits = [max(mine[s].added_p99_passes, 1e-2) for s in SCENARIOS]
            tputs = [mine[s].long_vs_baseline or 0.0 for s in SCENARIOS]
            ax_wait.bar(x + k * width, waits, width, label=policy)
            ax_tput.bar(x + k * width, tputs, width, label=policy)
        ax_wait.axhline(1.5, color="k", ls="--", lw=0.8, label="target 1.5 passes")
        ax_wait.set(yscale="log", ylabel="short added wait p99 (interactive passes, log)", title=preset)
        ax_tput.axhline(0.95, color="k", ls="--", lw=0.8, label="target 95%")
        ax_tput.set(ylabel="long prefill throughput / baseline", title=preset)
        for ax in (ax_wait, ax_tput):
            ax.set_xticks(x + 0.4 - width / 2, SCENARIOS, rotation=15, fontsize=8)
            ax.grid(alpha=0.3, axis="y")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", action="append", choices=sorted(PRESETS), help="repeat; default both cards")
    parser.add_argument("--plot", type=Path, default=Path("docs/overload.png"))
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    with recording("overload", "Short requests under overload, per policy (simulator)") as run:
        rows = run_all(args.preset or [H100_8B.name, CARD12GB.name])
        print_table(rows, Console(width=200))
        plot(rows, args.plot)
        if args.json:
            args.json.write_text("[" + ",".join(r.model_dump_json() for r in rows) + "]")
        print(f"plot: {args.plot}")
        run.add_markdown(markdown(rows))


if __name__ == "__main__":
    main()
