"""The CPU Ray Serve's own processes take while the app is idle, with the shipped controller loop and Serve's default.

    python -m benchmarks.serve_idle_cpu [--rounds 3] [--seconds 30]

The laptop app (`config.yaml`: two simulated engine replicas, the ingress, the embedder) on a local Ray, started
afresh each phase with its top-level `controller_options` as shipped
(`serve_app.config.serve_path.CONTROL_LOOP_ENV`: the control loop every 0.5 s) or without that period (Serve's
0.1 s), the rest of them as shipped (HAProxy's front, the ingress's drain, the priorities). The two take turns in
rounds, the order swapped every round, so a pair of phases shares the machine's state. Per phase, after the app has
settled: the cores each kind of process used (`loadtests.cpu_share.CpuSampler`); then the median over rounds and,
per round, the shipped total over the default's. No traffic: what a node pays before it serves anything, which on
two cores is CPU its engines lose. Writes docs/results/serve-idle-cpu/.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path
from typing import Any

from harness.results import records
from loadtests.app import LocalApp
from loadtests.cpu_share import KINDS, CpuSampler
from serve_app.config.serve_path import CONTROL_LOOP_ENV

CONFIG = Path(__file__).resolve().parents[1] / "config.yaml"
SETTLE_S = 10.0
"""After the app reports ready: replicas finish starting and Serve's first rounds of health checks pass."""
SETTINGS = ("shipped", "Serve's default")
NOT_RAY_OR_SERVE = {
    "sglang schedulers",
    "sglang detokenizers",
    "sglang servers (HTTP, tokenizer)",
    "sglang-router",
    "Locust",
}
PROCESSES: list[tuple[str, re.Pattern[str]]] = [
    (kind, re.compile(pattern)) for kind, _, pattern in KINDS if kind not in NOT_RAY_OR_SERVE
]
"""Ray's and Serve's processes, by the kinds the peer benchmark tells apart (`loadtests.cpu_share.KINDS`, in its
order: a process counts as the first it matches)."""


def with_serves_control_loop(cfg: dict[str, Any]) -> None:
    """The config with Serve's own control loop period: its controller options less the period, and nothing else
    (the same front, drain and priorities)."""
    for key in CONTROL_LOOP_ENV:
        cfg["controller_options"]["runtime_env"]["env_vars"].pop(key)


def phase(setting: str, seconds: float) -> dict[str, float]:
    edit = with_serves_control_loop if setting == "Serve's default" else None
    with LocalApp(CONFIG, {}, edit=edit):
        time.sleep(SETTLE_S)
        sampler = CpuSampler(table=PROCESSES, rest=False)  # Ray's and Serve's processes, not the machine's
        sampler.start()
        time.sleep(seconds)
        return sampler.stop()


@records("serve-idle-cpu", "The CPU Ray Serve's own processes take on an idle app, by controller loop")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.serve_idle_cpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="Sampled idle time a phase.")
    ap.add_argument("--rounds", type=int, default=3, help="Rounds: each setting once a round, the order swapped.")
    args = ap.parse_args(argv)
    print(f"{CONFIG.name}, idle; {args.rounds} rounds of {args.seconds:.0f} s a setting after {SETTLE_S:.0f} s")
    rounds: list[dict[str, dict[str, float]]] = []
    for i in range(args.rounds):
        order = SETTINGS if i % 2 == 0 else SETTINGS[::-1]
        rounds.append({s: phase(s, args.seconds) for s in order})
    names = [name for name, _ in PROCESSES]
    print("\n| process | " + " | ".join(f"{s} (cores, median)" for s in SETTINGS) + " |")
    print("| --- | " + " | ".join("---" for _ in SETTINGS) + " |")
    for name in [*names, "total"]:
        medians = [statistics.median(_figure(r[s], name) for r in rounds) for s in SETTINGS]
        print(f"| {name} | " + " | ".join(f"{m:.3f}" for m in medians) + " |")
    ratios = [sum(r[SETTINGS[0]].values()) / sum(r[SETTINGS[1]].values()) for r in rounds]
    print(
        f"\n{SETTINGS[0]} over {SETTINGS[1]}, total per round: {', '.join(f'{x:.2f}x' for x in ratios)} "
        f"(median {statistics.median(ratios):.2f}x)"
    )
    return 0


def _figure(cores: dict[str, float], name: str) -> float:
    return sum(cores.values()) if name == "total" else cores[name]


if __name__ == "__main__":
    raise SystemExit(main())
