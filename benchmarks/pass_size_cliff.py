"""The cliff of static pass sizes: chat TTFT against the interactive pass size, with and without slot-aware passes.

On h100-8b's bursts (`kv-burst`, `doc-flood`: two chats a second among documents) static interactive passes of
1,024-2,048 tokens made chats wait seconds where 256 gave a fifth of one. The cause is the running slots: a stream
holds its slot for as many passes as it has tokens, so bigger passes keep more chats decoding at once; past the
slot limit (32 here) each new chat waits for a stream to finish, at the big passes' pace. With slot-aware passes
(`slot_aware_passes`, the default) passes carry no long prefill while short requests lack slots, and the wait for a
slot runs at decode speed.

For each scenario, static pass size (SLO sizing off, the quiet pass at the chunk budget) and setting of
`slot_aware_passes`: chat TTFT p50/p99/max, the passes planned while a chat waited for a running slot, the chats
decoding at once (mean and most) and document throughput. Writes a result file under docs/results/pass-size-cliff/.

    python benchmarks/pass_size_cliff.py [--scenario kv-burst] [--preset h100-8b]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness/, when run as a script

from harness.results import BenchmarkRun
from scheduler.sim.engine import SimEngine
from scheduler.sim.metrics import measure
from scheduler.sim.presets import H100_8B, PRESETS
from scheduler.sim.rules import make_scheduler
from scheduler.sim.runner import run
from scheduler.sim.workload import scenario
from scheduler.traffic import TrafficClass

SCENARIOS = ["kv-burst", "doc-flood"]
PASS_TOKENS = [256, 512, 768, 1024, 1536, 2048]


class Row(BaseModel):
    scenario: str
    pass_tokens: int
    slot_aware: bool
    ttft_p50_s: float
    ttft_p99_s: float
    ttft_max_s: float
    slot_wait_passes: int
    """Passes planned while a short request waited and no running slot was free."""
    chats_decoding_mean: float
    chats_decoding_max: int
    docs_tok_per_s: float | None


def measure_row(preset_name: str, name: str, pass_tokens: int, slot_aware: bool) -> Row:
    preset = PRESETS[preset_name]
    spec = (
        f"fairshare:slo_sizing=false,slot_aware_passes={str(slot_aware).lower()},"
        f"interactive_pass_tokens={pass_tokens},quiet_pass_tokens={preset.chunk_budget_tokens}"
    )
    decoding: list[int] = []
    slot_waits = 0

    def before(engine: SimEngine) -> None:
        nonlocal slot_waits
        decoding.append(sum(r.traffic_class is TrafficClass.SHORT for r in engine.iter_decoding()))
        slot_waits += bool(engine.waiting_short) and engine.free_running_slots <= 0

    result = run(scenario(name, preset).requests(), preset, make_scheduler(spec, preset), spec, before_step=before)
    m = measure(result)
    short, long_ = m.classes["short"], m.classes.get("long")
    return Row(
        scenario=name,
        pass_tokens=pass_tokens,
        slot_aware=slot_aware,
        ttft_p50_s=short.ttft_s.p50,
        ttft_p99_s=short.ttft_s.p99,
        ttft_max_s=short.ttft_s.max,
        slot_wait_passes=slot_waits,
        chats_decoding_mean=float(np.mean(decoding)),
        chats_decoding_max=max(decoding),
        docs_tok_per_s=None if long_ is None else long_.long_prefill_tok_per_s,
    )


COLUMNS = [
    "scenario",
    "interactive pass tokens",
    "slot-aware passes",
    "chat TTFT p50 / p99 / max s",
    "passes with a chat waiting for a slot",
    "chats decoding mean / max",
    "docs tok/s",
]


def cells(r: Row) -> list[str]:
    return [
        r.scenario,
        str(r.pass_tokens),
        "on" if r.slot_aware else "off",
        f"{r.ttft_p50_s:.3g} / {r.ttft_p99_s:.3g} / {r.ttft_max_s:.3g}",
        str(r.slot_wait_passes),
        f"{r.chats_decoding_mean:.1f} / {r.chats_decoding_max}",
        "—" if r.docs_tok_per_s is None else f"{r.docs_tok_per_s:.0f}",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="repeat; default both")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=H100_8B.name)
    args = parser.parse_args(argv)
    bench = BenchmarkRun("pass-size-cliff")
    jobs = [(s, p, aware) for s in args.scenario or SCENARIOS for p in PASS_TOKENS for aware in (False, True)]
    rows = [measure_row(args.preset, *job) for job in tqdm(jobs, unit="run", desc="cliff")]
    preset = PRESETS[args.preset]
    title = f"Chat TTFT against static pass sizes on {args.preset} ({preset.max_running_requests} running slots)"
    table = Table(title=title)
    for c in COLUMNS:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(*cells(r))
    Console(width=200).print(table)
    body = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    body += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    print(f"result: {bench.write(title, chr(10).join(body))}")


if __name__ == "__main__":
    main()
