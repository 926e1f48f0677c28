"""Side-by-side load benchmark: one Locust shape, headless, under upstream's policy and under fairshare,
switched live through the `Engine` deployment's `user_config.policy`; the simulator's prediction of
the same workload beside each; one table with ratios, Locust's CSV/HTML and a PNG in `--out`.

    python -m loadtests.bench                                   # article scenario, sim app, card12gb-27b preset
    python -m loadtests.bench --shape ramp --time-scale 0.1     # step ramp (users vs short TTFT p99)
    python -m loadtests.bench --config my-config.yaml           # another deploy config, started here
    python -m loadtests.bench --url http://serve.example:8000   # a running deployment: one run, as deployed
    python -m loadtests.bench -- --think-s 3:9 --chat-turns 4   # after --: more locustfile options

"Upstream" is the `baseline` rule set through the live config (`upstream_policy_overrides`): the
`fairshare` engine with every `PolicyConfig` field set to upstream's, checked on the replica before
the run. Times are engine seconds (wall seconds / time scale).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from harness.results import records
from loadtests import app as appmod
from loadtests.prediction import predict
from loadtests.recording import read_samples
from loadtests.report import Run, figures, fmt, per_stage_short_ttft_p99, plot, ratio, rows, slo_of, to_engine_time
from loadtests.settings import LoadSettings, describe_error, register, to_flags
from loadtests.shapes.up_down_stages import up_down_stages
from loadtests.stages import Stage, article_stages, ramp_stages, soak_stages, stage_index
from scheduler.sim.presets import PRESETS
from scheduler.sim.rules import RuleSet, policy_for

REPO = Path(__file__).resolve().parents[1]
LOCUSTFILE = REPO / "loadtests" / "locustfile.py"
SHAPES = {
    "article": ("loadtests/shapes/article.py", article_stages, 1),
    "ramp": ("loadtests/shapes/ramp.py", ramp_stages, None),
    "soak": ("loadtests/shapes/soak.py", soak_stages, None),
    "up_down": ("loadtests/shapes/up_down.py", up_down_stages, None),
}
"""name -> (shape file, its stages, chat users fixed)."""

# The article's workload (the article): its document lengths, one document per session, sent 1 s apart (the
# order matters to the engine), 30-token questions from a chat session every 7.3 s (one question a
# session, as `doc-4sessions` models them).
SHAPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "article": dict(
        doc_tokens="130000,100000,93098,70689",
        docs_per_user=1,
        doc_gap_s=1.0,
        doc_followups=1,
        doc_max_tokens=32,
        question_tokens="30",
        chat_turns=1,
        chat_max_tokens=16,
        think_s="7.3",
    ),
    "ramp": dict(doc_tokens="30000:130000", ramp_step_s=60, ramp_max_users=20, chat_weight=4, doc_weight=1),
    "soak": dict(doc_tokens="30000:130000", soak_s=300, soak_users=6),
    # An autoscaler's load (`benchmarks.autoscale_ramp`): documents with two follow-ups each, four chat users to a
    # document user.
    "up_down": dict(doc_tokens="30000:130000", chat_weight=4, doc_weight=1, doc_followups=2),
}
POLICIES = {"upstream": RuleSet.BASELINE, "fairshare": RuleSet.FAIRSHARE}
LOCUST_EXIT_GRACE_S = 120
TABLE_WIDTH = 150
"""Console width when the output is not a terminal (a log file): the table stays on one line a row."""
DEFAULT_TIME_SCALE = 0.2
"""The article shape (420 engine s) then takes 84 s a run."""


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    ap = argparse.ArgumentParser(prog="python -m loadtests.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="article")
    ap.add_argument("--config", type=Path, default=REPO / "config.yaml", help="Deploy config to start here.")
    ap.add_argument("--url", default="", help="Target a running deployment instead (no policy switching).")
    ap.add_argument("--label", default="as deployed", help="With --url: the run's label.")
    ap.add_argument("--preset", default="card12gb-27b", help=f"Sim preset, one of {sorted(PRESETS)}.")
    ap.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="Sim time scale, wall s per engine s (default 0.2 for the app started here, 1 with --url).",
    )
    ap.add_argument("--engine-replicas", type=int, default=1, help="Engine replicas (1: documents and chats share).")
    ap.add_argument("--policies", default="upstream,fairshare", help="Runs, in order: upstream, fairshare.")
    ap.add_argument("--predict", choices=["auto", "none", *sorted(r.value for r in RuleSet)], default="auto")
    ap.add_argument("--out", type=Path, default=Path("loadtest-out"), help="Output folder.")
    args, extra = ap.parse_known_args(argv)
    if extra and extra[0] == "--":
        extra = extra[1:]
    errors = []
    if args.preset not in PRESETS:
        errors.append(f"--preset {args.preset!r}: choose from {sorted(PRESETS)}")
    args.sim_backend = not args.url and config_backend(args.config) == "sim"
    if args.time_scale is None:
        args.time_scale = DEFAULT_TIME_SCALE if args.sim_backend else 1.0
    elif not args.url and not args.sim_backend:
        args.time_scale = 1.0  # a real engine started here has no clock to scale
    if args.time_scale <= 0:
        errors.append(f"--time-scale {args.time_scale}: must be > 0")
    if args.engine_replicas < 1:
        errors.append(f"--engine-replicas {args.engine_replicas}: must be >= 1")
    bad = [p for p in args.policies.split(",") if p not in POLICIES]
    if bad:
        errors.append(f"--policies: unknown {bad}; choose from {sorted(POLICIES)}")
    if not args.url and not args.config.is_file():
        errors.append(f"--config {args.config}: no such file")
    if errors:
        ap.error("; ".join(errors))
    return args, extra


def engine_label(args: argparse.Namespace) -> str:
    """What served the run, for the printed figures: a sim preset, or real sglang (CPU figures on a CPU device)."""
    if args.sim_backend:
        return f"sim preset {args.preset}, time scale {args.time_scale:g}"
    try:
        sglang = yaml.safe_load(args.config.read_text())["applications"][0]["args"]["sglang"]
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError):
        sglang = {}
    device = (sglang.get("engine_args") or {}).get("device", "cuda")
    where = "CPU figures: real sglang on this machine's CPU, no GPU speed" if device == "cpu" else f"device {device}"
    return f"real sglang, model {sglang.get('model_path', '?')} ({where}), wall seconds"


def config_backend(path: Path) -> str:
    try:
        return yaml.safe_load(path.read_text())["applications"][0].get("args", {}).get("backend", "sim")
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError, AttributeError):
        return "sim"  # an unreadable file is reported by the app's own validation when it starts


def load_settings(shape: str, extra: list[str], time_scale: float) -> tuple[dict[str, Any], LoadSettings]:
    """The locustfile options of this run (shape defaults, then `extra`) and the settings they make."""
    parser = argparse.ArgumentParser(add_help=False)
    register(parser, env_vars=False)
    given, _ = parser.parse_known_args(extra)
    values = {**SHAPE_DEFAULTS[shape], "time_scale": time_scale}
    values.update({k: v for k, v in vars(given).items() if v is not None})
    try:
        return values, LoadSettings.model_validate(values)
    except ValidationError as e:
        raise SystemExit(f"bench: bad option: {describe_error(e)}") from None


def run_locust(
    url: str, shape: str, values: dict[str, Any], extra: list[str], out: Path, label: str, wall_s: float
) -> tuple[list, float, int]:
    """One headless Locust run of the shape; returns (samples, start time, exit code)."""
    samples = out / f"{label}.samples.jsonl"
    samples.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        f"{LOCUSTFILE},{REPO / SHAPES[shape][0]}",
        "--headless",
        "--host",
        url,
        "--csv",
        str(out / label),
        "--html",
        str(out / f"{label}.html"),
        "--only-summary",
        *to_flags({**values, "samples_file": str(samples)}),
        *extra,
    ]
    log = out / f"{label}.locust.log"
    with open(log, "w") as f:
        # The load generator must not outrank the app it measures.
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, preexec_fn=lambda: os.nice(15))
        bar = tqdm(total=round(wall_s), desc=label, unit="s", disable=None, leave=False)
        t0 = time.monotonic()
        try:
            while proc.poll() is None:
                time.sleep(1.0)
                bar.n = min(round(time.monotonic() - t0), bar.total)
                bar.set_postfix(requests=_lines(samples))
                if time.monotonic() - t0 > wall_s + LOCUST_EXIT_GRACE_S:
                    proc.terminate()
        finally:
            bar.close()
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    start_file = Path(f"{samples}.start")
    if not start_file.exists():
        raise SystemExit(f"bench: Locust did not start; see {log}")
    return read_samples(samples) if samples.exists() else [], float(start_file.read_text()), proc.returncode


def _lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def stages_reached(run: Run, stages: list[Stage]) -> int:
    """How many of the shape's stages a served run entered (by its requests' send times)."""
    reached = [stage_index(stages, s.sent_at_s) for s in run.samples]
    return max((i for i in reached if i is not None), default=len(stages) - 1) + 1


def upstream_policy(args: argparse.Namespace) -> dict[str, Any]:
    """Upstream through the live config: on the sim engine the whole `baseline` rule set of the preset; on sglang
    the same rules less what sglang's own arguments set (its chunk size and running slots are upstream's)."""
    if args.sim_backend:
        return appmod.upstream_policy_overrides(args.preset)
    return appmod.sglang_upstream_overrides()


def expected_policy(preset: str, rules: RuleSet) -> dict[str, Any]:
    return policy_for(rules, PRESETS[preset])[0].model_dump()


@records("loadtests-bench", "Locust side by side: upstream's rules and fairshare on one app")
def main(argv: list[str] | None = None) -> None:
    args, extra = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else TABLE_WIDTH)
    values, settings = load_settings(args.shape, extra, args.time_scale)
    _, stages_of, chat_fixed = SHAPES[args.shape]
    stages: list[Stage] = stages_of(settings)
    wall_s = settings.wall_s(stages[-1].until_s)
    args.out.mkdir(parents=True, exist_ok=True)
    served: list[tuple[str, RuleSet | None, Run, int]] = []

    if args.url:
        console.print(f"[bold]{args.shape}[/] against {args.url}: one run ({wall_s:.0f} s), policy as deployed")
        slo = slo_of(appmod.engine_view(args.url, appmod.wait_ready(args.url))["policy"])
        samples, start, rc = run_locust(args.url, args.shape, values, extra, args.out, "run", wall_s)
        run = Run(args.label, to_engine_time(samples, start, settings.time_scale), slo=slo)
        served.append((args.label, None, run, rc))
    else:
        overrides = {
            "sim": {"preset": args.preset, "rules": "fairshare", "natural_output_tokens": 4096},
            "engine_replicas": args.engine_replicas,
            "time_scale": args.time_scale,
        }
        names = args.policies.split(",")
        console.print(
            f"[bold]{args.shape}[/]: {args.config.name} with {engine_label(args)}, "
            f"{args.engine_replicas} engine replica(s); runs {names}, {wall_s:.0f} s each (+ start-up)"
        )
        with appmod.LocalApp(args.config, overrides) as local:
            model = appmod.wait_ready(local.url)
            for name in names:
                rules = POLICIES[name]
                local.set_policy(upstream_policy(args) if name == "upstream" else {})
                view = appmod.wait_idle(local.url, model)
                if args.sim_backend and view["policy"] != expected_policy(args.preset, rules):
                    raise SystemExit(f"bench: the replica runs {view['policy']}, not the {rules.value} rules")
                samples, start, rc = run_locust(local.url, args.shape, values, extra, args.out, name, wall_s)
                engine_samples = to_engine_time(samples, start, args.time_scale)
                run = Run(name, engine_samples, policy=name, slo=slo_of(view["policy"]))
                served.append((name, rules, run, rc))

    predictions: dict[str, Run] = {}
    for name, rules, run, _ in served:
        spec = rules.value if args.predict == "auto" and rules is not None and args.sim_backend else args.predict
        if spec in ("auto", "none") or args.engine_replicas != 1:
            continue
        ran = stages[: stages_reached(run, stages)]  # the ramp stops at its knee: predict what was run
        samples = predict(settings, ran, PRESETS[args.preset], spec, chat_users_fixed=chat_fixed)
        predictions[name] = Run(f"{name} (sim)", samples, policy=name, simulated=True, slo=run.slo)

    table = build_table(args, served, predictions)
    console.print(table)
    if args.shape == "ramp":
        print_knee(console, served, stages)
    write_outputs(args, served, predictions, stages)
    console.print(f"CSV, HTML, samples, table.json and plot.png in {args.out}/")


def build_table(args, served, predictions) -> Table:
    title = (
        f"{args.shape} shape, engine seconds; served = through HTTP (Locust), sim = scheduler.sim's prediction "
        f"of the same closed-loop users"
    )
    if not args.url and not args.sim_backend:
        title = f"{args.shape} shape; served = through HTTP (Locust); {engine_label(args)}"
    t = Table(title=title, title_justify="left")
    t.add_column("metric")
    for name, _, _, _ in served:
        t.add_column(f"{name}\nserved", justify="right")
        if name in predictions:
            t.add_column(f"{name}\nsim", justify="right")
            t.add_column(f"{name}\nserved/sim", justify="right")
    names = [n for n, _, _, _ in served]
    compare = "upstream" in names and "fairshare" in names
    if compare:
        t.add_column("fairshare/\nupstream", justify="right")
    figs = {n: figures(run.samples, run.slo) for n, _, run, _ in served}
    sims = {n: figures(r.samples, r.slo) for n, r in predictions.items()}
    for label, unit in rows():
        row = [f"{label} ({unit})" if unit else label]
        for n in names:
            row.append(fmt(figs[n][label], unit))
            if n in sims:
                row += [fmt(sims[n][label], unit), _ratio(figs[n][label], sims[n][label])]
        if compare:
            row.append(_ratio(figs["fairshare"][label], figs["upstream"][label]))
        t.add_row(*row)
    return t


def _ratio(a, b) -> str:
    r = ratio(a, b)
    return "—" if r is None else f"{r:.2f}x"


def print_knee(console: Console, served, stages: list[Stage]) -> None:
    for name, _, run, _ in served:
        t = Table(title=f"{name}: short TTFT p99 per ramp step (engine s)", title_justify="left")
        for c in ("step", "short requests", "short TTFT p99"):
            t.add_column(c, justify="right")
        for label, n, p99 in per_stage_short_ttft_p99(run.samples, stages):
            t.add_row(label, str(n), fmt(p99, "s"))
        console.print(t)


def write_outputs(args, served, predictions, stages) -> None:
    data = {
        "shape": args.shape,
        "preset": args.preset,
        "time_scale": args.time_scale,
        "stages": [s.__dict__ for s in stages],
        "served": {n: {"figures": figures(r.samples, r.slo), "locust_exit_code": rc} for n, _, r, rc in served},
        "sim": {n: figures(r.samples, r.slo) for n, r in predictions.items()},
        "slo": {n: [r.slo.ttft_s, r.slo.tbt_s] for n, _, r, _ in served},
    }
    (args.out / "table.json").write_text(json.dumps(data, indent=2))
    plot([r for _, _, r, _ in served] + list(predictions.values()), args.out / "plot.png")


if __name__ == "__main__":
    main()
