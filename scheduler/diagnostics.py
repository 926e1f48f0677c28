"""Diagnostic log lines, off by default. Cheap when off: nothing is formatted."""

from __future__ import annotations

import logging
from typing import Any

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


def pass_cost_line(fit: dict[str, Any]) -> str:
    """An online pass-cost fit (`OnlinePassCost.describe`): ``pass cost fitted: fixed=8.12ms prefill=25.1us/tok
    pairs=2.03ns decode_row=98.7us decode_ctx=40.2ns window=512 observed=4096 fits=127 error=3.4% margin=4.1%``
    (``error``: its median error over the window; ``margin``: the error it states, which the SLO sizer charges each
    predicted pass with)."""
    c = fit["coefficients"]
    error = fit["median_abs_rel_error"]
    frozen = f" frozen=({fit['frozen']})" if fit["frozen"] else ""
    return (
        f"pass cost {fit['model']}: fixed={c['fixed_s'] * 1e3:.3g}ms prefill={c['prefill_token_s'] * 1e6:.3g}us/tok "
        f"pairs={c['prefill_pair_s'] * 1e9:.3g}ns decode_row={c['decode_row_s'] * 1e6:.3g}us "
        f"decode_ctx={c['decode_ctx_token_s'] * 1e9:.3g}ns window={fit['window_passes']} "
        f"observed={fit['observed_passes']} fits={fit['fits']} error={'-' if error is None else f'{error:.1%}'} "
        f"margin={fit['relative_error']:.1%}{frozen}"
    )


def log_pass_cost(cfg: PolicyConfig, fit: dict[str, Any]) -> None:
    if cfg.diagnostics:
        logger.info(pass_cost_line(fit))


def log_plan(cfg: PolicyConfig, plan: PassPlan) -> None:
    if not cfg.diagnostics:
        return
    for r in plan.rejections:
        logger.info(rejection_line(r))
    logger.info(budget_line(plan))
