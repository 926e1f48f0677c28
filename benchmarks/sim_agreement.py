"""The simulator against real sglang on random mixes, pass by pass: how many prefill passes are identical.

    python -m benchmarks.sim_agreement [--seeds 30] [--first-seed 1000] [--mixes-per-engine 40]

Four setups (`harness.sim_vs_sglang.SETUPS`): sglang 0.5.23 with the plugin running the simulator's `fairshare`
rule set, and sglang with the plugin off (its own decisions traced) against the simulator's `baseline` rule set,
each with sglang's mixed chunk off and on. Each runs the hand-written mixes and `--seeds` random mixes
(`harness.workload_mixes.random_mix`, seeds from `--first-seed`; the CI test uses seeds below 1000) through real
sglang on CPU with a tiny random-weight model (256-token chunk, three running slots, a 4,096-token KV pool; at most
`--mixes-per-engine` mixes per engine start) and through the simulator, replaying each arrival where sglang saw
it. A prefill pass is identical when both admit the same requests with the same tokens, cut the same request,
carry as many decoding rows, reject the same requests for KV and leave as many waiting. Writes the table and
every differing pass to docs/results/sim-agreement/ (``FAIRSHARE_RESULTS_DIR`` moves it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path

from harness.pass_agreement import Agreement
from harness.results import recording
from harness.sim_vs_sglang import LIMITS, SETUPS, Setup, compare_on_sglang
from harness.tiny_model import TinyModelSpec, build_tiny_model
from harness.workload_mixes import HAND_WRITTEN, SLOT_TURNOVER, Mix, random_mix
from scheduler.sglang_plugin.loading import TESTED_SGLANG_VERSION

TITLE = "Simulator against real sglang: identical prefill passes on random mixes"
TARGET_SHARE = 0.98
"""The acceptance figure: the share of prefill passes that must be identical, per setup."""
MAX_LISTED = 30


def run_setup(model_dir: Path, mixes: Sequence[Mix], setup: Setup, work_dir: Path, per_engine: int) -> Agreement:
    total = Agreement(setup.name)
    for start in range(0, len(mixes), per_engine):
        part = compare_on_sglang(model_dir, mixes[start : start + per_engine], setup, work_dir / f"run{start}")
        total.mixes += part.mixes
        total.num_busy_arrivals += part.num_busy_arrivals
        print(f"  {part.summary(max_listed=0)}", flush=True)
    return total


def mix_table(mixes: Sequence[Mix]) -> str:
    def count(test) -> int:
        return sum(1 for m in mixes if test(m))

    kv = LIMITS.kv_pool_tokens
    rows = [
        ("mixes", len(mixes)),
        ("requests", sum(len(m.requests) for m in mixes)),
        ("more requests than running slots", count(lambda m: len(m.requests) > LIMITS.max_running_requests)),
        ("KV needs above the pool", count(lambda m: sum(r.prompt_tokens + r.output_tokens for r in m.requests) > kv)),
        ("a document above the short-request bound", count(lambda m: any(r.prompt_tokens > 2048 for r in m.requests))),
        ("arriving in 2-3 batches", count(lambda m: len(m.after_passes) > 1)),
    ]
    return "\n".join(["| mixes | count |", "| --- | ---: |", *(f"| {name} | {n} |" for name, n in rows)])


def agreement_table(results: Sequence[Agreement]) -> str:
    lines = [
        "| setup | mixes | requests arriving mid-mix | prefill passes (sglang / simulator) | identical | share "
        f"| known differences | unexplained | ≥ {TARGET_SHARE:.0%} |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    for a in results:
        known = ", ".join(f"{reason}: {n}" for reason, n in sorted(a.explained.items())) or "none"
        real, sim = sum(len(m.real) for m in a.mixes), sum(len(m.sim) for m in a.mixes)
        met = "met" if a.share_identical >= TARGET_SHARE and not a.unexplained else "missed"
        lines.append(
            f"| {a.setup} | {len(a.mixes)} | {a.num_busy_arrivals} | {a.num_passes} ({real} / {sim}) "
            f"| {a.num_identical} | {100 * a.share_identical:.1f}% | {known} | {len(a.unexplained)} | {met} |"
        )
    return "\n".join(lines)


def differences(results: Sequence[Agreement]) -> str:
    out = []
    for a in results:
        listed = [(m.mix, i, x, y, reason) for m in a.mixes for i, x, y, reason in m.differences()]
        if not listed:
            continue
        out += [f"### {a.setup}", ""]
        for mix, i, real, sim, reason in listed[:MAX_LISTED]:
            out += [f"- `{mix}` pass {i} ({reason or 'unexplained'})", f"  - sglang: `{real}`", f"  - sim: `{sim}`"]
        if len(listed) > MAX_LISTED:
            out.append(f"- ... {len(listed) - MAX_LISTED} more")
        out.append("")
    return "\n".join(out) or "None: every compared prefill pass is identical."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=30, help="random mixes per setup (default 30)")
    parser.add_argument("--first-seed", type=int, default=1000, help="the first random mix's seed (default 1000)")
    parser.add_argument("--mixes-per-engine", type=int, default=40, help="mixes run on one engine start (default 40)")
    parser.add_argument("--work-dir", type=Path, help="keep the traces and engine logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    for name, value in (("--seeds", args.seeds), ("--mixes-per-engine", args.mixes_per_engine)):
        if value < 1:
            parser.error(f"{name} must be at least 1, got {value}")
    if version("sglang") != TESTED_SGLANG_VERSION:
        parser.error(
            f"needs sglang {TESTED_SGLANG_VERSION} (the CPU stand-in covers it); installed: {version('sglang')}"
        )
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    mixes = [*HAND_WRITTEN, SLOT_TURNOVER, *(random_mix(seed) for seed in seeds)]
    with recording("sim-agreement", TITLE) as run, tempfile.TemporaryDirectory(prefix="sim-agreement-") as tmp:
        work = args.work_dir or Path(tmp)
        model_dir = build_tiny_model(work / "tiny-llama", TinyModelSpec())
        results = []
        for i, setup in enumerate(SETUPS):
            print(f"{setup.name}:", flush=True)
            results.append(run_setup(model_dir, mixes, setup, work / f"setup{i}", args.mixes_per_engine))
        for agreement in results:
            print(agreement.summary(max_listed=0))
        run.add_markdown("## Agreement per setup\n\n" + agreement_table(results))
        run.add_markdown(
            f"## The mixes (the same in every setup)\n\nThe hand-written mixes ({len(HAND_WRITTEN) + 1}) and random "
            f"mixes of seeds {seeds.start} to {seeds.stop - 1}.\n\n" + mix_table(mixes)
        )
        run.add_markdown("## Differing passes\n\n" + differences(results))
    return 0 if all(a.share_identical >= TARGET_SHARE and not a.unexplained for a in results) else 1


if __name__ == "__main__":
    sys.exit(main())
