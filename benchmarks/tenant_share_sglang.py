"""Tenants sharing one real sglang engine on CPU: a lone document beside a tenant that floods the engine.

    python -m benchmarks.tenant_share_sglang [--runs 3]

The simulator's flood (`benchmarks.tenant_share`) on a CPU sglang 0.5.23 server with the plugin and the tiny model
(`harness.tenant_flood`): one tenant sends four documents at once, another one document of the same length once the
flood's first is in prefill, every request naming its tenant in the ``x-smg-routing-key`` header as the Serve app
does; tenant fairness on, then off (``FAIRSHARE_TENANT_FAIRNESS=false``, a server of its own). Per run, from the
plugin's pass trace: the pass the lone document started in and those of the flood's documents still waiting when it
arrived, and its share of the prefill while both tenants were backlogged; from the client: its time to first token
beside the flood and alone (alternated). Per setting: its prefill rate beside the flood against alone (the ratio of
the median TTFTs). Takes about two minutes; writes docs/results/tenant-share-sglang/.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from harness.results import records
from harness.tenant_flood import Flood, Measured, measure, started_before, tenant_server
from harness.tiny_model import TinyModelSpec, build_tiny_model


def report(setting: str, measured: Measured) -> None:
    for k, (alone_s, run) in enumerate(zip(measured.alone_ttft_s, measured.runs, strict=True)):
        later = run.waiting_flood_docs()
        starts = ", ".join(str(run.first_pass(rid)) for rid in later)
        share = run.lone_share()
        print(
            f"{setting:<8} {k:>3} {run.first_pass(run.lone):>10} {starts:>18} "
            f"{'yes' if started_before(run, later) else 'no':>7} {'-' if share is None else f'{share:.3f}':>7} "
            f"{run.lone_ttft_s:>9.3f} {alone_s:>9.3f}",
            flush=True,
        )
    shares = [s for s in (r.lone_share() for r in measured.runs) if s is not None]
    median_share = f"{statistics.median(shares):.3f}" if shares else "-"
    print(
        f"{setting:<8} median share while both backlogged {median_share}; "
        f"prefill rate beside the flood {measured.rate_ratio():.2f}x alone",
        flush=True,
    )


@records("tenant-share-sglang", "Tenants sharing one CPU sglang engine: a lone document beside a flood")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tenant_share_sglang", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="flood runs per setting (each beside a run alone)")
    args = ap.parse_args(argv)
    flood = Flood()
    print(
        f"{flood.num_flood_docs} documents from one tenant, then 1 from another, {flood.doc_tokens} prompt tokens and "
        f"{flood.max_new_tokens} output tokens each; pass: the planned pass of the lone document's first chunk and "
        "those of the flood's documents still waiting when it arrived; share: the lone document's share of the "
        "prefill while both tenants were backlogged; TTFT beside the flood and alone"
    )
    print(
        f"{'tenants':<8} {'run':>3} {'lone pass':>10} {'flood passes':>18} {'first':>7} {'share':>7} "
        f"{'beside s':>9} {'alone s':>9}"
    )
    with tempfile.TemporaryDirectory(prefix="tenant-share-sglang-") as tmp:
        model = build_tiny_model(Path(tmp) / "model", TinyModelSpec())
        for setting, fairness in (("on", True), ("off", False)):
            trace, log = Path(tmp) / f"{setting}.jsonl", Path(tmp) / f"{setting}.log"
            with tenant_server(model, trace, log, tenant_fairness=fairness) as server:
                report(setting, measure(server, trace, flood, args.runs, tag=setting))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
