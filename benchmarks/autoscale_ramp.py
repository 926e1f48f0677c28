"""Autoscaling under a ramp: Serve's request-count policy against the SLO policy, on the sim app in real time.

The laptop app (`config.yaml`: the sim engine on the h100-8b preset in real time, static lanes) with its `Engine`
deployment autoscaled from 1 to 4 replicas as the KubeRay cpu-demo overlay scales it
(`serve_app.config.kuberay.OVERLAYS["cpu-demo"]`: its maximum, target ongoing requests and upscale delay), under
one policy a run:

- `requests`: Serve's default policy on `target_ongoing_requests`, as the overlay ships it;
- `slo`: the SLO policy (`serve_app.autoscaling`), its default kwargs.

Both run with the same bounds and delays, written as the cluster gets them (`serve_app.config.kuberay.
engine_autoscaling`). The downscale delay is `--downscale-delay-s` for both: the overlay's 600 s would keep every
replica to the end of a few-minute ramp, so neither policy could show what it gives back. Locust plays the
`up_down` shape (`loadtests/shapes/up_down.py`): chats and documents (4:1) low, up in steps, a plateau, down, low
again; every seed (`--seeds`) runs both policies, in alternating order, each on a fresh Ray (its own temp dir) and a
fresh app.

Per run: chat (short) SLO attainment, judged by the replica's own targets (`loadtests.report.short_attainment`);
document prefill tokens/s (`loadtests.report.long_prefill_tok_per_s`); replica-seconds, the RUNNING Engine
replicas from `serve.status()` once a second, integrated over the shape; goodput, requests that met their class's
SLO (`scheduler.slo`: chats by the targets, documents by being answered) per second; and the headline, good
requests per replica-hour. Printed: a table per policy (mean, then each seed), the replicas and chat misses per
stage, the ratios slo/requests and the acceptance verdicts. Writes a result file (`harness/results.py`) and a
plot of replicas over time per policy with the offered load beside it.

    python -m benchmarks.autoscale_ramp [--seeds 3] [--quick] [--policies requests,slo]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from harness import local_serve as sc
from harness.ray_tmpdir import own_ray_tmpdir
from harness.results import LATEST_NAME, latest, recording
from loadtests import app as appmod
from loadtests import bench
from loadtests.recording import Sample
from loadtests.report import long_prefill_tok_per_s, short_attainment, slo_of, to_engine_time
from loadtests.settings import LoadSettings
from loadtests.shapes.up_down_stages import up_down_stages
from loadtests.stages import Stage, stage_index
from scheduler.slo import SloTargets, attainment, meets_slo, targets_for
from scheduler.traffic import TrafficClass
from serve_app.config.autoscaling import SLO_POLICY_FUNCTION
from serve_app.config.kuberay import OVERLAYS, EngineScaling, engine_autoscaling

REPO = Path(__file__).resolve().parents[1]
NAME = "autoscale-ramp"
TITLE = "Autoscaling under a ramp: Serve's request-count policy against the SLO policy (sim engine, real time)"
CONFIG = REPO / "config.yaml"
ENGINE = "Engine"
SHAPE = "up_down"
POLICIES = ("requests", "slo")
OVERLAY = "cpu-demo"
MIN_REPLICAS = 1
MAX_REPLICAS = 4
POLL_S = 1.0
"""How often the RUNNING replicas are read: finer than any scaling step (Serve's control loop here is 0.5 s, its
delays tens of seconds)."""
DOWNSCALE_DELAY_S = 60.0
"""Long enough that a replica is not given back inside one step of the ramp, short enough to show within its
low tail."""
TIME_SCALE = 1.0
"""The laptop app's own: the engine in real time, so the SLO targets and Serve's delays are in one clock."""

ATTAINMENT_TARGET = 0.99
"""Chat SLO attainment the SLO policy must reach."""
REPLICA_SECONDS_RATIO_MAX = 0.8
"""Or-clause one: at most this many replica-seconds (slo/requests) with equal or better chat attainment."""
GOODPUT_RATIO_MIN = 1.5
"""Or-clause two: at least this much goodput per replica-hour (slo/requests)."""

WORKLOAD: dict[str, Any] = {**bench.SHAPE_DEFAULTS[SHAPE], "time_scale": TIME_SCALE}
"""The locustfile's mix as `loadtests.bench` plays the shape: documents of 30k-130k tokens with two follow-ups each,
four chat users to a document user; think times and chat lengths its defaults."""
TABLE_WIDTH = 160


@dataclass(frozen=True)
class Scale:
    seeds: int
    step_s: float
    step_users: int
    max_users: int


SCALES = {
    # 240 s of load a run (2 low steps, 2 up, 3 on the plateau, 2 down, 3 low): 6 runs and their start-ups in
    # about 30 minutes on 2 cores. On the plateau more requests are in flight than one replica's target (8): the
    # request-count policy scales up there.
    "default": Scale(seeds=3, step_s=20.0, step_users=8, max_users=32),
    # A smoke test: one seed, 60 s of load a run.
    "quick": Scale(seeds=1, step_s=5.0, step_users=8, max_users=32),
}


# -- the app under each policy -------------------------------------------------------------------------------------


def scaling(downscale_delay_s: float) -> EngineScaling:
    """The overlay's Engine scaling as shipped, with the benchmark's downscale delay (the same for both policies)."""
    shipped = OVERLAYS[OVERLAY].scaling
    assert shipped.max_replicas == MAX_REPLICAS, "the benchmark's bound is the overlay's"
    return shipped.model_copy(update={"downscale_delay_s": downscale_delay_s})


def autoscale(cfg: dict[str, Any], policy: str, engine_scaling: EngineScaling) -> None:
    """Turn the loaded laptop config (in place) into the autoscaled one: the Engine's fixed `num_replicas` becomes
    the `autoscaling_config` the cluster would get (`kuberay.engine_autoscaling`) from `MIN_REPLICAS`, on `policy`;
    nothing else changes."""
    engine = sc.deployment(cfg, ENGINE)
    engine.pop("num_replicas", None)
    under_policy = engine_scaling.model_copy(update={"policy": policy})
    engine["autoscaling_config"] = engine_autoscaling(MIN_REPLICAS, under_policy)


# -- replicas over time --------------------------------------------------------------------------------------------


def running_engines(app: str = sc.APP, deployment: str = ENGINE) -> int:
    """RUNNING replicas of the deployment, as `serve.status()` counts them (starting and stopping ones are not)."""
    from ray import serve

    states = serve.status().applications[app].deployments[deployment].replica_states
    return int(states.get("RUNNING", 0))  # type: ignore[call-overload]


class ReplicaPoller:
    """Reads `count()` every `period_s` on a thread of its own: `polls` is [(epoch s, count)]."""

    def __init__(self, count: Callable[[], int] = running_engines, period_s: float = POLL_S) -> None:
        self.count, self.period_s = count, period_s
        self.polls: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replica-poller", daemon=True)

    def __enter__(self) -> ReplicaPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a missed read holds the last count (see `replica_seconds`)
                self.polls.append((time.time(), self.count()))
            self._stop.wait(self.period_s)


def replica_seconds(polls: Sequence[tuple[float, int]], start_s: float, end_s: float) -> float:
    """The integral of the replica count over [start_s, end_s]: each poll's count holds until the next poll; before
    the first poll its count holds too (the run starts with the replicas the first poll finds)."""
    if not polls or end_s <= start_s:
        return 0.0
    total = polls[0][1] * max(0.0, min(polls[0][0], end_s) - start_s)
    for (t, n), (t_next, _) in zip(polls, [*polls[1:], (end_s, 0)], strict=True):
        total += n * max(0.0, min(t_next, end_s) - max(t, start_s))
    return total


def replica_changes(polls: Sequence[tuple[float, int]], start_s: float, end_s: float) -> list[tuple[float, int]]:
    """(time, count) at the window's start and at each poll in it whose count differs from the one before: when
    the policy's decisions took effect."""
    out: list[tuple[float, int]] = []
    for t, n in polls:
        if t > end_s:
            break
        if t <= start_s:
            out = [(start_s, n)]  # the count the window starts with
        elif not out or out[-1][1] != n:
            out.append((t, n))
    return out


# -- one run -------------------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    """One policy under one seed: its samples and replica polls, both in seconds from the start of the load."""

    policy: str
    seed: int
    slo: SloTargets
    samples: list[Sample]
    polls: list[tuple[float, int]]
    span_s: float
    """The shape's length: the window replicas are integrated and goodput counted over."""
    locust_exit_code: int = 0


def load_values(scale: Scale, seed: int) -> dict[str, Any]:
    return {
        **WORKLOAD,
        "ramp_step_s": scale.step_s,
        "ramp_step_users": scale.step_users,
        "ramp_max_users": scale.max_users,
        "seed": seed,
    }


def run_one(policy: str, seed: int, scale: Scale, engine_scaling: EngineScaling, out: Path) -> RunResult:
    """A fresh app under `policy`, the shape played once, the replicas polled throughout."""
    values = load_values(scale, seed)
    stages = up_down_stages(LoadSettings.model_validate(values))
    wall_s = stages[-1].until_s * TIME_SCALE
    edit = partial(autoscale, policy=policy, engine_scaling=engine_scaling)
    with appmod.LocalApp(CONFIG, {}, edit=edit) as app:
        model = appmod.wait_ready(app.url)
        slo = slo_of(appmod.engine_view(app.url, model)["policy"])  # the targets the replicas run
        with ReplicaPoller() as poller:
            samples, start, rc = bench.run_locust(app.url, SHAPE, values, [], out, f"{policy}-seed{seed}", wall_s)
    polls = [((t - start) / TIME_SCALE, n) for t, n in poller.polls]
    span_s = stages[-1].until_s
    return RunResult(policy, seed, slo, to_engine_time(samples, start, TIME_SCALE), polls, span_s, rc)


# -- figures -------------------------------------------------------------------------------------------------------


def meets_class_slo(s: Sample, slo: SloTargets) -> bool:
    """Did the request meet its class's SLO (`scheduler.slo.targets_for`)? One shed or failed never does."""
    return s.ok and meets_slo(targets_for(TrafficClass(s.traffic_class), slo), s.ttft_s, s.itl_s)


@dataclass(frozen=True)
class Figures:
    chat_attainment: float | None
    """Share of short requests (chats and follow-up questions) sent that met the targets."""
    chat_requests: int
    doc_tok_per_s: float | None
    replica_s: float
    goodput_per_s: float
    good_per_replica_hour: float | None
    max_replicas: int


def figures_of(run: RunResult) -> Figures:
    chats = short_attainment(run.samples, run.slo)
    in_span = [s for s in run.samples if s.sent_at_s < run.span_s]
    good = attainment((meets_class_slo(s, run.slo) for s in in_span), run.span_s)
    replica_s = replica_seconds(run.polls, 0.0, run.span_s)
    return Figures(
        chat_attainment=None if chats is None else chats.fraction,
        chat_requests=0 if chats is None else chats.num_requests,
        doc_tok_per_s=long_prefill_tok_per_s(run.samples),
        replica_s=replica_s,
        goodput_per_s=good.goodput_per_s or 0.0,
        good_per_replica_hour=good.num_met / (replica_s / 3600) if replica_s > 0 else None,
        max_replicas=max((n for t, n in run.polls if 0 <= t <= run.span_s), default=0),
    )


FIELDS = ("chat_attainment", "doc_tok_per_s", "replica_s", "goodput_per_s", "good_per_replica_hour")


def mean_figures(figs: Sequence[Figures]) -> dict[str, float | None]:
    """Each figure's mean over seeds (None when a seed has none)."""
    out: dict[str, float | None] = {}
    for name in FIELDS:
        values = [getattr(f, name) for f in figs]
        out[name] = None if not values or any(v is None for v in values) else sum(values) / len(values)
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


@dataclass(frozen=True)
class Verdicts:
    """The acceptance: the SLO policy keeps chats within their targets, and does so with fewer replicas for the
    same attainment or with much more goodput per replica."""

    slo_attainment: float | None
    attainment_met: bool
    replica_s_ratio: float | None
    attainment_not_worse: bool
    fewer_replicas: bool
    goodput_ratio: float | None
    more_goodput: bool

    @property
    def passed(self) -> bool:
        return self.attainment_met and (self.fewer_replicas or self.more_goodput)


def verdicts(requests: dict[str, float | None], slo: dict[str, float | None]) -> Verdicts:
    """From each policy's mean figures (`mean_figures`)."""
    att_slo, att_req = slo["chat_attainment"], requests["chat_attainment"]
    not_worse = att_slo is not None and (att_req is None or att_slo >= att_req)
    rs = ratio(slo["replica_s"], requests["replica_s"])
    gp = ratio(slo["good_per_replica_hour"], requests["good_per_replica_hour"])
    return Verdicts(
        slo_attainment=att_slo,
        attainment_met=att_slo is not None and att_slo >= ATTAINMENT_TARGET,
        replica_s_ratio=rs,
        attainment_not_worse=not_worse,
        fewer_replicas=rs is not None and rs <= REPLICA_SECONDS_RATIO_MAX and not_worse,
        goodput_ratio=gp,
        more_goodput=gp is not None and gp >= GOODPUT_RATIO_MIN,
    )


def miss_reason(s: Sample, slo: SloTargets) -> str | None:
    """Why a short request missed its SLO: `failed` (shed or failed), `ttft`, `tbt` (TTFT judged first); None if
    it met it."""
    if not s.ok:
        return "failed"
    if not meets_slo(SloTargets(ttft_s=slo.ttft_s), s.ttft_s, ()):
        return "ttft"
    if not meets_slo(SloTargets(tbt_s=slo.tbt_s), s.ttft_s, s.itl_s):
        return "tbt"
    return None


@dataclass(frozen=True)
class StageView:
    """What one policy did in one stage, over its seeds."""

    label: str
    mean_replicas: float
    chats: int
    missed: dict[str, int]
    """Short requests that missed, by `miss_reason`."""


def stage_views(runs: Sequence[RunResult], stages: Sequence[Stage]) -> list[StageView]:
    """Per stage: mean RUNNING replicas over the runs, and the short requests sent in it with how they missed."""
    views = []
    start = 0.0
    for i, st in enumerate(stages):
        replicas = [replica_seconds(r.polls, start, st.until_s) / (st.until_s - start) for r in runs]
        shorts = [
            (s, r.slo)
            for r in runs
            for s in r.samples
            if s.traffic_class == "short" and stage_index(stages, s.sent_at_s) == i
        ]
        missed = Counter(reason for s, slo in shorts if (reason := miss_reason(s, slo)) is not None)
        views.append(StageView(st.label, sum(replicas) / max(1, len(replicas)), len(shorts), dict(missed)))
        start = st.until_s
    return views


# -- output --------------------------------------------------------------------------------------------------------


def _f(v: float | None, fmt: str = ".3g") -> str:
    return "—" if v is None else format(v, fmt)


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.2f}%"


def policy_table(policy: str, runs: Sequence[RunResult]) -> Table:
    figs = [figures_of(r) for r in runs]
    t = Table(title=f"{policy}: mean over {len(runs)} seed(s), then each seed", title_justify="left")
    for col in (
        "run",
        "chat SLO attainment",
        "chats",
        "doc prefill tok/s",
        "replica-s",
        "max replicas",
        "goodput req/s",
        "good req / replica-h",
        "locust rc",
    ):
        t.add_column(col, justify="right")
    m = mean_figures(figs)
    t.add_row(
        "mean",
        _pct(m["chat_attainment"]),
        "",
        _f(m["doc_tok_per_s"], ",.0f"),
        _f(m["replica_s"], ",.0f"),
        "",
        _f(m["goodput_per_s"]),
        _f(m["good_per_replica_hour"], ",.0f"),
        "",
    )
    for r, f in zip(runs, figs, strict=True):
        t.add_row(
            f"seed {r.seed}",
            _pct(f.chat_attainment),
            str(f.chat_requests),
            _f(f.doc_tok_per_s, ",.0f"),
            _f(f.replica_s, ",.0f"),
            str(f.max_replicas),
            _f(f.goodput_per_s),
            _f(f.good_per_replica_hour, ",.0f"),
            str(r.locust_exit_code),
        )
    return t


def stage_table(by_policy: dict[str, list[RunResult]], stages: Sequence[Stage]) -> Table:
    t = Table(
        title="per stage, over seeds: mean RUNNING replicas; short requests sent / missed by TTFT, by TBT, failed or "
        "shed",
        title_justify="left",
    )
    t.add_column("stage")
    t.add_column("until s", justify="right")
    for policy in by_policy:
        t.add_column(f"{policy}\nreplicas", justify="right")
        t.add_column(f"{policy}\nsent / ttft / tbt / failed", justify="right")
    views = {p: stage_views(runs, stages) for p, runs in by_policy.items()}
    for i, st in enumerate(stages):
        row = [st.label, f"{st.until_s:g}"]
        for p in by_policy:
            v = views[p][i]
            m = v.missed
            row += [
                f"{v.mean_replicas:.2f}",
                f"{v.chats} / {m.get('ttft', 0)} / {m.get('tbt', 0)} / {m.get('failed', 0)}",
            ]
        t.add_row(*row)
    return t


def verdict_lines(v: Verdicts) -> list[str]:
    def mark(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    return [
        f"ratios slo/requests: replica-seconds {_f(v.replica_s_ratio)}x, good requests per replica-hour "
        f"{_f(v.goodput_ratio)}x",
        f"[{mark(v.attainment_met)}] slo chat SLO attainment {_pct(v.slo_attainment)} >= {ATTAINMENT_TARGET:.0%}",
        f"[{mark(v.fewer_replicas)}] replica-seconds <= {REPLICA_SECONDS_RATIO_MAX}x requests' "
        f"({_f(v.replica_s_ratio)}x) at equal or better chat attainment ({'yes' if v.attainment_not_worse else 'no'})",
        f"[{mark(v.more_goodput)}] good requests per replica-hour >= {GOODPUT_RATIO_MIN}x requests' "
        f"({_f(v.goodput_ratio)}x)",
        f"acceptance: {mark(v.passed)} (attainment, and fewer replica-seconds or more goodput per replica-hour)",
    ]


def plot(by_policy: dict[str, list[RunResult]], stages: Sequence[Stage], path: Path) -> None:
    """One panel a policy: RUNNING Engine replicas over the run, a line a seed, and the offered users behind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(by_policy), 1, figsize=(10, 3.2 * len(by_policy)), sharex=True, squeeze=False)
    edges = [0.0, *(s.until_s for s in stages)]
    users = [s.users for s in stages]
    for i, (ax, (policy, runs)) in enumerate(zip(axes[:, 0], by_policy.items(), strict=True)):
        load = ax.twinx()
        load.stairs(users, edges, fill=True, color="0.85", label="offered users")
        load.set_ylabel("users (chats + documents, 4:1)")
        load.set_ylim(0, max(users) * 1.15)
        ax.set_zorder(load.get_zorder() + 1)
        ax.patch.set_visible(False)
        for j, r in enumerate(runs):
            ts = [t for t, _ in r.polls if 0 <= t <= r.span_s]
            ns = [n for t, n in r.polls if 0 <= t <= r.span_s]
            ax.step(ts, ns, where="post", color=f"C{i}", alpha=0.5 + 0.5 / (j + 1), label=f"seed {r.seed}")
        ax.set(ylabel="RUNNING replicas", ylim=(0, MAX_REPLICAS + 0.5), yticks=range(MAX_REPLICAS + 1), title=policy)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=7)
        load.legend(loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("seconds from the start of the load")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def attach_plot(by_policy: dict[str, list[RunResult]], stages: Sequence[Stage]) -> Path | None:
    """The plot beside the newest result file, linked from it and from `latest.md`."""
    path = latest(NAME)
    if path is None:
        return None
    png = path.with_suffix(".png")
    plot(by_policy, stages, png)
    link = f"\n![RUNNING Engine replicas over the ramp, per policy, with the offered load]({png.name})\n"
    for written in (path, path.parent / LATEST_NAME):
        written.write_text(written.read_text() + link)
    return png


# -- main ----------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.autoscale_ramp", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="Smoke-test scale: one seed, a shorter ramp.")
    ap.add_argument("--seeds", type=int, default=None, help="Seeds, each running every policy (default 3; 1 quick).")
    ap.add_argument("--policies", default=",".join(POLICIES), help="Policies to run, in order: requests, slo.")
    ap.add_argument(
        "--downscale-delay-s",
        type=float,
        default=DOWNSCALE_DELAY_S,
        help=f"Serve's downscale delay for both policies (default {DOWNSCALE_DELAY_S:g}; the overlay ships "
        f"{OVERLAYS[OVERLAY].scaling.downscale_delay_s:g}).",
    )
    ap.add_argument("--out", type=Path, default=REPO / "loadtest-out" / NAME, help="Locust's files and samples.")
    args = ap.parse_args(argv)
    args.policies = args.policies.split(",")
    errors = [f"--policies: unknown {p!r}" for p in args.policies if p not in POLICIES]
    if args.seeds is not None and args.seeds < 1:
        errors.append("--seeds: at least 1")
    if errors:
        ap.error("; ".join(errors))
    base = SCALES["quick" if args.quick else "default"]
    args.scale = base if args.seeds is None else Scale(args.seeds, base.step_s, base.step_users, base.max_users)
    return args


def run_order(policies: Sequence[str], seed: int) -> list[str]:
    """Every seed runs every policy; the order alternates, so a drift in the machine's load favours neither."""
    return list(policies) if seed % 2 == 0 else list(policies)[::-1]


def describe(args: argparse.Namespace, engine_scaling: EngineScaling, stages: Sequence[Stage]) -> str:
    s = args.scale
    steps = ", ".join(f"{st.label} to {st.until_s:g} s" for st in stages)
    return (
        f"{CONFIG.name} (sim, h100-8b, time scale {TIME_SCALE:g}); Engine autoscaling {MIN_REPLICAS}-"
        f"{engine_scaling.max_replicas} replicas, target_ongoing_requests {engine_scaling.target_ongoing_requests:g}, "
        f"upscale delay {engine_scaling.upscale_delay_s:g} s, downscale delay {engine_scaling.downscale_delay_s:g} s "
        f"(the {OVERLAY} overlay's, downscale delay the benchmark's), the same for every policy; slo = "
        f"{SLO_POLICY_FUNCTION} with default kwargs\n"
        f"load (Locust, up_down shape, {s.seeds} seed(s), policies {', '.join(args.policies)}): documents "
        f"{WORKLOAD['doc_tokens']} tokens with {WORKLOAD['doc_followups']} follow-ups, chat:document users "
        f"{WORKLOAD['chat_weight']}:{WORKLOAD['doc_weight']}; {steps}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    engine_scaling = scaling(args.downscale_delay_s)
    stages = up_down_stages(LoadSettings.model_validate(load_values(args.scale, 0)))
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console(width=None if sys.stdout.isatty() else TABLE_WIDTH)
    by_policy: dict[str, list[RunResult]] = {p: [] for p in args.policies}
    with recording(NAME, TITLE):
        print(describe(args, engine_scaling, stages), flush=True)
        with own_ray_tmpdir("autoscale-ramp-"):
            for seed in range(args.scale.seeds):
                for policy in run_order(args.policies, seed):
                    print(f"seed {seed}, {policy}: {stages[-1].until_s:g} s of load", flush=True)
                    try:
                        by_policy[policy].append(run_one(policy, seed, args.scale, engine_scaling, args.out))
                    except Exception as e:  # the other runs still say something; the result file names this one
                        print(f"seed {seed}, {policy}: did not run: {type(e).__name__}: {str(e)[:300]}", flush=True)
        report(console, by_policy, stages)
    png = attach_plot(by_policy, stages)
    if png is not None:
        print(f"plot: {png.relative_to(REPO) if png.is_relative_to(REPO) else png}")
    return 0


def report(console: Console, by_policy: dict[str, list[RunResult]], stages: Sequence[Stage]) -> None:
    slos = {r.slo for runs in by_policy.values() for r in runs}
    print("chat SLO targets (the replicas' policy): " + "; ".join(f"TTFT {s.ttft_s} s, TBT {s.tbt_s} s" for s in slos))
    by_policy = {p: runs for p, runs in by_policy.items() if runs}
    for policy, runs in by_policy.items():
        console.print(policy_table(policy, runs))
        for r in runs:
            steps = ", ".join(f"{n} at {t:.0f} s" for t, n in replica_changes(r.polls, 0.0, r.span_s))
            print(f"  seed {r.seed}, RUNNING replicas: {steps}")
    console.print(stage_table(by_policy, stages))
    if set(by_policy) >= set(POLICIES):
        means = {p: mean_figures([figures_of(r) for r in runs]) for p, runs in by_policy.items()}
        v = verdicts(means["requests"], means["slo"])
        ca = ratio(means["slo"]["chat_attainment"], means["requests"]["chat_attainment"])
        print(f"ratio slo/requests of chat SLO attainment: {_f(ca, '.4f')}x")
        for line in verdict_lines(v):
            print(line)
    else:
        print("verdicts: need both policies (--policies requests,slo)")


if __name__ == "__main__":
    sys.exit(main())
