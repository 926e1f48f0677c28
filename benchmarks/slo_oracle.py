"""SLO-driven pass sizing against the best static setting for the same SLO (the oracle), on the simulator.

For each preset and scenario (every overload scenario plus `mixed-poisson`, sized for the preset), the run judges
short requests by the preset's interactive SLO (`scheduler.slo`: TTFT within the target and the p99 of each
stream's gaps within the TBT target) and measures document prefill throughput against `baseline` (upstream
sglang) on the same workload, over `--seeds` draws of the scenario's arrivals pooled. Three policies:

- `fairshare`: the default policy, passes sized from the SLO and the preset's cost model; one config for every
  scenario, nothing tuned per scenario;
- the oracle: every static knob setting of a grid (`fairshare:slo_sizing=false,...`: interactive and quiet pass
  sizes, activity window), and the one with the best document throughput among those that keep the SLO for at
  least `ATTAINMENT` of the short requests, chosen per scenario with hindsight: the grid runs on the first seed,
  and its settings, best throughput first, on the others until one keeps the SLO over all of them;
- `baseline`, the throughput reference.

The acceptance table prints, per row, the SLO-driven figures, the oracle's pick and the verdicts: on `h100-8b`,
TTFT p99 and TBT p99 within the targets with attainment >= 99% and documents >= 0.95x baseline; on
`card12gb-27b`, documents >= 0.98x the oracle's best (where some setting keeps the SLO). Beside them, the most
document throughput any run that serves the chats as fairshare did can reach (`scheduler.sim.ceiling`). Writes a
result file under docs/results/slo-oracle/ (`harness.results`).

    python benchmarks/slo_oracle.py [--preset h100-8b] [--scenario kv-burst] [--grid small] [--seeds 3]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness/, when run as a script

from harness.results import BenchmarkRun
from scheduler.sim.ceiling import slot_ceiling
from scheduler.sim.experiments import run_spec
from scheduler.sim.metrics import measure
from scheduler.sim.presets import CARD12GB, H100_8B, PRESETS, Preset
from scheduler.sim.runner import RunResult
from scheduler.sim.workload import OVERLOAD_SCENARIOS, Workload, scenario

SCENARIOS = [*OVERLOAD_SCENARIOS, "mixed-poisson"]
ATTAINMENT = 0.99
"""Share of short requests (over every seed) that must meet the SLO for a policy to count as keeping it."""
SEEDS = 3
"""Seeds of each scenario's arrivals: a setting picked with hindsight on one draw of arrivals can keep the SLO by
luck (on the 12 GB card a static setting kept it on the first seed of poisson-50 and missed on the next four)."""
H100_DOCS_VS_BASELINE = 0.95
CARD12GB_DOCS_VS_ORACLE = 0.98

GRIDS: dict[str, dict[str, list[int]]] = {
    "full": {
        "interactive_pass_tokens": [256, 512, 768, 1024, 1536, 2048, 3072],
        "quiet_pass_tokens": [1024, 2048, 4096, 8192],
        "activity_window_passes": [32, 256],
    },
    "small": {
        "interactive_pass_tokens": [512, 1024, 2048],
        "quiet_pass_tokens": [2048, 8192],
        "activity_window_passes": [32],
    },
}


class Outcome(BaseModel):
    """One policy's figures, pooled over the seeds it ran."""

    spec: str
    seeds: list[int]
    ttft_p99_s: float | None
    """The worst seed's."""
    tbt_p99_s: float | None
    num_short: int
    num_met: int
    """Short requests that met the SLO, over every seed."""
    docs_tok_per_s: float | None
    """The mean over seeds."""

    @property
    def attainment(self) -> float | None:
        return self.num_met / self.num_short if self.num_short else None

    @property
    def keeps_slo(self) -> bool:
        return self.attainment is not None and self.attainment >= ATTAINMENT

    def could_keep(self, num_seeds: int) -> bool:
        """Whether the SLO can still be kept over `num_seeds` seeds of about this many short requests each (the
        misses so far are within the whole run's allowance)."""
        return self.num_short - self.num_met <= (1.0 - ATTAINMENT) * self.num_short * num_seeds / len(self.seeds)

    def pooled(self, other: Outcome) -> Outcome:
        docs = [o.docs_tok_per_s for o in (self, other)]
        weights = [len(o.seeds) for o in (self, other)]
        return Outcome(
            spec=self.spec,
            seeds=[*self.seeds, *other.seeds],
            ttft_p99_s=_worst(self.ttft_p99_s, other.ttft_p99_s),
            tbt_p99_s=_worst(self.tbt_p99_s, other.tbt_p99_s),
            num_short=self.num_short + other.num_short,
            num_met=self.num_met + other.num_met,
            docs_tok_per_s=None
            if None in docs
            else sum(d * w for d, w in zip(docs, weights, strict=True) if d is not None) / sum(weights),
        )


def _worst(a: float | None, b: float | None) -> float | None:
    return max((v for v in (a, b) if v is not None), default=None)


class Row(BaseModel):
    preset: str
    scenario: str
    baseline: Outcome
    fairshare: Outcome
    oracle: Outcome | None
    """The grid's best static setting that keeps the SLO over every seed; None when none does."""
    num_settings: int
    ceiling: float | None = None
    """`scheduler.sim.ceiling.slot_ceiling` of fairshare's runs (their mean): the most document throughput any run
    that serves the chat tokens they served during the document windows reaches."""

    def docs_vs(self, other: Outcome | None) -> float | None:
        mine, theirs = self.fairshare.docs_tok_per_s, None if other is None else other.docs_tok_per_s
        return None if mine is None or not theirs else mine / theirs


def grid_specs(preset: Preset, grid: dict[str, list[int]]) -> list[str]:
    """Static settings of the grid that the preset accepts (pass sizes within its chunk budget)."""
    specs = []
    for values in itertools.product(*grid.values()):
        knobs = dict(zip(grid, values, strict=True))
        if max(knobs["interactive_pass_tokens"], knobs["quiet_pass_tokens"]) > preset.chunk_budget_tokens:
            continue
        specs.append("fairshare:slo_sizing=false," + ",".join(f"{k}={v}" for k, v in knobs.items()))
    return specs


def workload(preset: Preset, name: str, seed_offset: int) -> Workload:
    """The scenario with its arrivals drawn from its own seed plus `seed_offset`."""
    base = scenario(name, preset)
    return base.model_copy(update={"seed": base.seed + seed_offset})


def outcome_of(spec: str, seed: int, result: RunResult) -> Outcome:
    m = measure(result)
    short, long_ = m.classes["short"], m.classes.get("long")
    return Outcome(
        spec=spec,
        seeds=[seed],
        ttft_p99_s=short.ttft_s.p99,
        tbt_p99_s=short.itl_s.p99,
        num_short=short.count,
        num_met=round((short.slo_attainment or 0.0) * short.count),
        docs_tok_per_s=None if long_ is None else long_.long_prefill_tok_per_s,
    )


class RowRunner:
    """Runs one row: baseline and fairshare on every seed, the grid on the first, and the grid's settings in
    order of their first-seed throughput on the other seeds until one keeps the SLO over all of them."""

    def __init__(self, preset: Preset, name: str, seeds: list[int], bar: tqdm[Any]) -> None:
        self.preset, self.name, self.seeds, self.bar = preset, name, seeds, bar

    def run(self, spec: str, seed: int) -> RunResult:
        result = run_spec(workload(self.preset, self.name, seed), spec, self.preset)
        self.bar.update()
        return result

    def outcome(self, spec: str, seeds: list[int]) -> Outcome:
        outcomes = [outcome_of(spec, s, self.run(spec, s)) for s in seeds]
        return functools.reduce(Outcome.pooled, outcomes)

    def oracle(self, specs: list[str]) -> Outcome | None:
        first = [self.outcome(spec, self.seeds[:1]) for spec in specs]
        hopeful = [o for o in first if o.could_keep(len(self.seeds)) and o.docs_tok_per_s is not None]
        for o in sorted(hopeful, key=lambda o: o.docs_tok_per_s or 0.0, reverse=True):
            if len(self.seeds) > 1:
                o = o.pooled(self.outcome(o.spec, self.seeds[1:]))
            if o.keeps_slo:
                return o
        return None

    def row(self, specs: list[str]) -> Row:
        baseline, fairshare, ceilings = [], [], []
        for seed in self.seeds:
            base, mine = self.run("baseline", seed), self.run("fairshare", seed)
            baseline.append(outcome_of("baseline", seed, base))
            fairshare.append(outcome_of("fairshare", seed, mine))
            ceilings.append(slot_ceiling(self.preset, base, mine))
        known = [c for c in ceilings if c is not None]
        return Row(
            preset=self.preset.name,
            scenario=self.name,
            baseline=functools.reduce(Outcome.pooled, baseline),
            fairshare=functools.reduce(Outcome.pooled, fairshare),
            oracle=self.oracle(specs),
            num_settings=len(specs),
            ceiling=sum(known) / len(known) if len(known) == len(ceilings) else None,
        )


def verdict(row: Row) -> str:
    preset = PRESETS[row.preset]
    f = row.fairshare
    slo = (
        f.keeps_slo
        and f.ttft_p99_s is not None
        and f.ttft_p99_s <= preset.ttft_target_s
        and (f.tbt_p99_s is None or f.tbt_p99_s <= preset.tbt_target_s)
    )
    if row.preset == CARD12GB.name:
        if row.oracle is None:
            return "no static setting keeps the SLO" + ("; fairshare keeps it" if slo else "")
        ratio = row.docs_vs(row.oracle)
        ok = slo and ratio is not None and ratio >= CARD12GB_DOCS_VS_ORACLE
        return "met" if ok else "missed: " + ("SLO" if not slo else f"docs < {CARD12GB_DOCS_VS_ORACLE}× oracle")
    ratio = row.docs_vs(row.baseline)
    docs = ratio is not None and ratio >= H100_DOCS_VS_BASELINE
    if slo and docs:
        return "met"
    missed = "missed: " + ", ".join(
        what for what, bad in (("SLO", not slo), (f"docs < {H100_DOCS_VS_BASELINE}× baseline", not docs)) if bad
    )
    if not docs and row.ceiling is not None and row.ceiling < H100_DOCS_VS_BASELINE:
        missed += f" (no run that serves these chats exceeds {row.ceiling:.3f}×: slot ceiling)"
    return missed


def _f(v: float | None, digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}g}"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.1f}%"


def _setting(o: Outcome | None) -> str:
    if o is None:
        return "none keeps the SLO"
    knobs = dict(item.split("=") for item in o.spec.split(":", 1)[1].split(",") if "slo_sizing" not in item)
    return "/".join(knobs[k] for k in ("interactive_pass_tokens", "quiet_pass_tokens", "activity_window_passes"))


COLUMNS = [
    "preset",
    "scenario",
    "SLO TTFT / TBT s",
    "fairshare TTFT p99 s",
    "fairshare TBT p99 s",
    "fairshare attainment",
    "fairshare docs × baseline",
    "oracle setting (interactive/quiet/window)",
    "oracle attainment",
    "oracle docs × baseline",
    "fairshare docs × oracle",
    "slot ceiling docs × baseline",
    "verdict",
]


def cells(row: Row) -> list[str]:
    preset = PRESETS[row.preset]
    base = row.baseline.docs_tok_per_s
    oracle = row.oracle
    return [
        row.preset,
        row.scenario,
        f"{preset.ttft_target_s:g} / {preset.tbt_target_s:g}",
        _f(row.fairshare.ttft_p99_s),
        _f(row.fairshare.tbt_p99_s),
        _pct(row.fairshare.attainment),
        _f(row.docs_vs(row.baseline)),
        _setting(oracle),
        _pct(None if oracle is None else oracle.attainment),
        _f(None if oracle is None or not base or oracle.docs_tok_per_s is None else oracle.docs_tok_per_s / base),
        _f(row.docs_vs(oracle)),
        _f(row.ceiling),
        verdict(row),
    ]


def markdown(rows: list[Row], grid: str, num_seeds: int) -> str:
    lines = [
        f"Grid `{grid}`: {', '.join(f'{k} {v}' for k, v in GRIDS[grid].items())}; a policy keeps the SLO when at "
        f"least {ATTAINMENT:.0%} of short requests meet it (TTFT and the p99 of their gaps within the targets) over "
        f"{num_seeds} seeds of each scenario's arrivals pooled. TTFT and TBT p99 are the worst seed's, document "
        "throughput the seeds' mean. Slot ceiling: the most document throughput a run that serves the chat tokens "
        "fairshare served during the documents' prefill can reach, whatever its policy (`scheduler.sim.ceiling`).",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + " --- |" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", action="append", choices=sorted(PRESETS), help="repeat; default both cards")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="repeat; default all")
    parser.add_argument("--grid", choices=sorted(GRIDS), default="full", help="static settings the oracle tries")
    parser.add_argument(
        "--seeds", type=int, default=SEEDS, help="seeds of each scenario's arrivals every policy is judged over"
    )
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, not {args.seeds}")
    seeds = list(range(args.seeds))
    run = BenchmarkRun("slo-oracle")
    presets = [PRESETS[p] for p in args.preset or [H100_8B.name, CARD12GB.name]]
    names = args.scenario or SCENARIOS
    plan = [(p, n, grid_specs(p, GRIDS[args.grid])) for p in presets for n in names]
    # The oracle's checks on the other seeds are not known ahead: the bar counts the runs that are.
    with tqdm(total=sum(2 * len(seeds) + len(specs) for _, _, specs in plan), unit="run", desc="slo-oracle") as bar:
        rows = [RowRunner(p, n, seeds, bar).row(specs) for p, n, specs in plan]
    table = Table(title="SLO-driven default against the best static setting (oracle) for the same SLO")
    for c in COLUMNS:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(*cells(r))
    Console(width=240).print(table)
    if args.json:
        args.json.write_text("[" + ",".join(r.model_dump_json() for r in rows) + "]")
    title = "SLO-driven pass sizing against the best static setting for the same SLO (simulator)"
    print(f"result: {run.write(title, markdown(rows, args.grid, len(seeds)))}")


if __name__ == "__main__":
    main()
