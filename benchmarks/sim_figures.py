"""The simulator's figures as result files: any `python -m scheduler.sim` command, its output kept.

    python -m benchmarks.sim_figures reproduce                 # docs/results/sim-reproduce/
    python -m benchmarks.sim_figures frontier --plot docs/frontier.png
    python -m benchmarks.sim_figures compare --scenario doc-4sessions --policy baseline --policy fairshare

The arguments are `scheduler.sim`'s own; the result goes to ``docs/results/sim-<command>/``.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("COLUMNS", "200")  # rich sizes its tables to the terminal; a result file has none

from harness.results import recording
from scheduler.sim.cli import build_parser
from scheduler.sim.cli import main as sim_main

TITLES = {
    "reproduce": "The source articles' figures against the simulator",
    "frontier": "Pass-size frontier: lone-document speed against question TTFT",
    "compare": "Policies side by side on one simulated workload",
    "calibrate": "The card12gb-27b preset refitted to the article's F sweep",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = build_parser().parse_args(argv).command  # a bad argument exits here, before anything is recorded
    with recording(f"sim-{command}", TITLES[command]):
        return sim_main(argv)


if __name__ == "__main__":
    sys.exit(main())
