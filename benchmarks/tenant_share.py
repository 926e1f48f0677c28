"""Tenants sharing one engine, on the simulator: the tenant scenarios (`python -m scheduler.sim compare --scenario
tenant-flood`, ...) under our policy with tenants (`fairshare`) and by request (`fairshare:tenant_fairness=false`).

Per scenario and policy: each tenant's tokens served, its share of the prefill while it was backlogged beside others
and while every tenant was, its TTFT p99; Jain's index over the passes in which tenants were backlogged
(`scheduler.sim.tenant_metrics`), the largest service gap between two backlogged tenants, document throughput
against the per-request rules and the chats' SLO attainment. Then the acceptance checks: a lone document beside a
flood of 20 gets at least 0.45 of the prefill while both wait, Jain at least 0.95, documents at least 0.97x, chats
within the SLO; weights 1:2:4 within 10% of 1/7, 2/7, 4/7. Writes docs/results/tenant-share/.

    python -m benchmarks.tenant_share [--preset h100-8b]
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from harness.results import records
from scheduler.sim.experiments import run_spec
from scheduler.sim.metrics import measure
from scheduler.sim.presets import H100_8B, PRESETS
from scheduler.sim.tenant_metrics import TenantReport, tenant_report
from scheduler.sim.workload import TENANT_SCENARIOS, scenario

TENANTS, BY_REQUEST = "fairshare", "fairshare:tenant_fairness=false"
console = Console(width=160)


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def run(preset_name: str) -> dict[str, dict[str, tuple[TenantReport, float | None, float | None]]]:
    """scenario -> policy -> (tenant report, document tok/s, chat SLO attainment)."""
    preset = PRESETS[preset_name]
    out: dict[str, dict[str, tuple[TenantReport, float | None, float | None]]] = {}
    for name in TENANT_SCENARIOS:
        out[name] = {}
        for policy in (TENANTS, BY_REQUEST):
            result = run_spec(scenario(name, preset), policy, preset)
            m = measure(result)
            docs, chats = m.classes.get("long"), m.classes.get("short")
            out[name][policy] = (
                tenant_report(result),
                docs.long_prefill_tok_per_s if docs else None,
                chats.slo_attainment if chats else None,
            )
    return out


def table(name: str, rows: dict[str, tuple[TenantReport, float | None, float | None]]) -> Table:
    t = Table(title=f"{name}: tenants by policy")
    for col in ("policy", "tenant", "weight", "tokens", "share beside others", "share, all waiting", "TTFT p99 s"):
        t.add_column(col, justify="left" if col in ("policy", "tenant") else "right")
    for policy, (report, docs, chats) in rows.items():
        for tenant, m in report.tenants.items():
            shares = (_f(m.share_while_backlogged), _f(m.share_while_all_backlogged))
            t.add_row(policy, tenant, _f(m.weight), str(m.tokens_served), *shares, _f(m.ttft_p99_s))
        t.add_row(
            policy,
            f"Jain {_f(report.jain_while_backlogged)}, gap {_f(report.max_service_gap_tokens)} tok",
            "",
            "",
            f"docs {_f(docs, 5)} tok/s",
            f"chat SLO {_f(chats)}",
            "",
        )
    return t


def checks(results: dict[str, dict[str, tuple[TenantReport, float | None, float | None]]]) -> list[str]:
    flood, by_request = results["tenant-flood"][TENANTS], results["tenant-flood"][BY_REQUEST]
    share = flood[0].tenants["team"].share_while_backlogged or 0.0
    jain = flood[0].jain_while_backlogged or 0.0
    docs = (flood[1] or 0.0) / (by_request[1] or 1.0)
    before = by_request[0].tenants["team"].share_while_backlogged
    lines = [
        f"lone document beside a flood of 20: share {share:.3f} while both wait (>= 0.45: "
        f"{'met' if share >= 0.45 else 'missed'}; by request {_f(before)})",
        f"Jain's index while backlogged {jain:.3f} (>= 0.95: {'met' if jain >= 0.95 else 'missed'}; "
        f"by request {_f(by_request[0].jain_while_backlogged)})",
        f"document throughput {docs:.3f}x by request (>= 0.97x: {'met' if docs >= 0.97 else 'missed'})",
        f"chat SLO attainment {_f(flood[2])} (by request {_f(by_request[2])})",
    ]
    weights = results["tenant-weights"][TENANTS][0].tenants
    for tenant, expected in (("bronze", 1 / 7), ("silver", 2 / 7), ("gold", 4 / 7)):
        got = weights[tenant].share_while_all_backlogged or 0.0
        ok = abs(got - expected) <= 0.1 * expected
        lines.append(f"weights 1:2:4, {tenant}: {got:.3f} of {expected:.3f} ({'met' if ok else 'missed'}: within 10%)")
    return lines


@records("tenant-share", "Tenants sharing one engine: shares while backlogged, Jain's index, the largest gap")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tenant_share", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default=H100_8B.name, choices=sorted(PRESETS))
    args = ap.parse_args(argv)
    results = run(args.preset)
    for name, rows in results.items():
        console.print(table(name, rows))
    print(f"\nacceptance ({args.preset}):")
    for line in checks(results):
        print(f"- {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
