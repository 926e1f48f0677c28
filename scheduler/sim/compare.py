"""Policies side by side on one workload: metrics per traffic class, ratios to the first policy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel
from tqdm import tqdm

from scheduler.sim.experiments import run_spec
from scheduler.sim.metrics import ClassMetrics, RunMetrics, measure
from scheduler.sim.presets import Preset
from scheduler.sim.runner import RunResult
from scheduler.sim.tenant_metrics import TenantReport, tenant_report
from scheduler.sim.workload import Workload
from scheduler.slo import SloTargets
from scheduler.traffic import TrafficClass

# (label, getter on ClassMetrics)
METRICS = {
    "TTFT p50 s": lambda c: c.ttft_s.p50,
    "TTFT p99 s": lambda c: c.ttft_s.p99,
    "TTFT max s": lambda c: c.ttft_s.max,
    "ITL p50 s": lambda c: c.itl_s.p50,
    "ITL p99 s": lambda c: c.itl_s.p99,
    "ITL max s": lambda c: c.itl_s.max,
    "ITL p99 during long prefill s": lambda c: c.itl_during_long_prefill_s.p99,
    "e2e p50 s": lambda c: c.e2e_s.p50,
    "e2e p99 s": lambda c: c.e2e_s.p99,
    "decode passes stalled": lambda c: float(c.decode_passes_stalled),
    "long prefill tok/s": lambda c: c.long_prefill_tok_per_s,
    "SLO attainment %": lambda c: None if c.slo_attainment is None else 100 * c.slo_attainment,
    "goodput req/s": lambda c: c.goodput_per_s,
}


class Cell(BaseModel):
    value: float | None
    ratio: float | None
    """value / the first policy's value."""


class Comparison(BaseModel):
    workload: str
    preset: str
    policies: list[str]
    decode_only_step_s: float
    slo: dict[str, tuple[float | None, float | None]]
    """class -> (TTFT target s, TBT target s) attainment is judged by, the same for every policy."""
    classes: dict[str, dict[str, dict[str, Cell]]]
    """class -> metric -> policy -> cell."""
    tenants: dict[str, TenantReport]
    """policy -> how its tenants shared the engine (`scheduler.sim.tenant_metrics`)."""


def compare(
    workload: Workload, specs: list[str], preset: Preset, slo: dict[TrafficClass, SloTargets] | None = None
) -> tuple[Comparison, list[RunResult]]:
    """Run each policy spec on `workload`; `slo`: class -> targets to judge by (default: the preset's)."""
    results = [run_spec(workload, spec, preset, progress=None) for spec in tqdm(specs, disable=None, unit="policy")]
    measured = [measure(r, slo) for r in results]
    classes: dict[str, dict[str, dict[str, Cell]]] = {}
    for cls in TrafficClass:
        if cls.value not in measured[0].classes:
            continue
        table: dict[str, dict[str, Cell]] = {}
        for label, get in METRICS.items():
            values = [_get(m, cls, get) for m in measured]
            if all(v is None for v in values):
                continue
            base = values[0]
            table[label] = {
                spec: Cell(value=v, ratio=None if v is None or not base else v / base)
                for spec, v in zip(specs, values, strict=True)
            }
        classes[cls.value] = table
    comparison = Comparison(
        workload=workload.name,
        preset=preset.name,
        policies=specs,
        decode_only_step_s=measured[0].decode_only_step_s,
        slo=measured[0].slo,
        classes=classes,
        tenants={spec: tenant_report(r) for spec, r in zip(specs, results, strict=True)},
    )
    return comparison, results


def _get(m: RunMetrics, cls: TrafficClass, get: Callable[[ClassMetrics], float | None]) -> float | None:
    c = m.classes.get(cls.value)
    return None if c is None else get(c)


def plot(results: list[RunResult], path: Path) -> None:
    """TTFT distributions per class and the ITL distribution of short streams, one colour per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax_ttft, ax_itl) = plt.subplots(1, 2, figsize=(12, 4.5))
    for result in results:
        for cls, style in ((TrafficClass.SHORT, "-"), (TrafficClass.LONG, "--")):
            ttfts = sorted(r.ttft_s for r in result.requests if r.traffic_class is cls and r.ttft_s is not None)
            if ttfts:
                ax_ttft.step(
                    ttfts,
                    np.linspace(0, 1, len(ttfts), endpoint=True),
                    style,
                    label=f"{result.policy} ({cls.value})",
                    where="post",
                )
        itls = sorted(x for r in result.requests if r.traffic_class is TrafficClass.SHORT for x in r.itls_s())
        if itls:
            ax_itl.step(itls, np.linspace(0, 1, len(itls)), label=result.policy, where="post")
    ax_ttft.set(xscale="log", xlabel="TTFT (s, log)", ylabel="fraction of requests", title="Time to first token")
    ax_itl.set(
        xscale="log",
        xlabel="inter-token latency (s, log)",
        ylabel="fraction of gaps",
        title="Short streams' inter-token latency",
    )
    for ax in (ax_ttft, ax_itl):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
