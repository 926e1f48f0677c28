"""Diagnostic log lines, off by default. Cheap when off: nothing is formatted."""

from __future__ import annotations

import logging

from scheduler.config import PolicyConfig
from scheduler.snapshot import PassPlan, Rejection

logger = logging.getLogger("fairshare.scheduler")


def rejection_line(r: Rejection) -> str:
    """The article's form: ``res=NO_TOKEN need=70945 rem_total=68534 rem_chunk=6144 chunked=2/8 can_run=2``."""
    return (
        f"res=NO_TOKEN need={r.need_tokens} rem_total={r.rem_total_tokens} rem_chunk={r.rem_chunk_tokens} "
        f"chunked={r.num_cut}/{r.max_cut} can_run={r.num_can_run} {'skip' if r.skipped else 'stop'} rid={r.rid}"
    )


def budget_line(plan: PassPlan) -> str:
    """``budget pass=94 cap=94 sharing=2 used=94 grants=[doc-a:64* q:30]`` (``*`` = cut), then, when the pass was
    sized from the targets or predicted by a cost model, ``sized=tbt bound_s=0.300 predicted_s=0.287`` (and
    ``missed=ttft`` for a target even the smallest pass breaks)."""
    grants = " ".join(f"{g.rid}:{g.tokens}{'*' if g.cut else ''}" for g in plan.grants)
    line = (
        f"budget pass={plan.pass_budget_tokens} cap={plan.cap_tokens} sharing={plan.num_sharing} "
        f"used={plan.num_prefill_tokens} grants=[{grants}]"
    )
    if plan.pass_bound_s is not None or plan.predicted_pass_s is not None:
        bound, predicted = _seconds(plan.pass_bound_s), _seconds(plan.predicted_pass_s)
        line += f" sized={plan.sized_by} bound_s={bound} predicted_s={predicted}"
    if plan.missed_targets:
        line += f" missed={','.join(plan.missed_targets)}"
    return line


def _seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.3f}"


def log_plan(cfg: PolicyConfig, plan: PassPlan) -> None:
    if not cfg.diagnostics:
        return
    for r in plan.rejections:
        logger.info(rejection_line(r))
    logger.info(budget_line(plan))
