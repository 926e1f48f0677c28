"""The structured pass trace: one JSON line per planned pass, written only when asked.

One record per pass that the policy planned: a summary of the snapshot (waiting requests, free KV and
running slots, the half-prefilled request, decoding streams), the requests the planner judged, the plan
(pass budget, F, grants, capacity rejections) and what the engine actually committed. The sglang plugin
writes it when ``FAIRSHARE_PASS_TRACE`` names a file; the simulator's engine produces the same records,
so a real sglang run and a simulated one compare pass by pass. Nothing is built or formatted when off.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduler.snapshot import Candidate, PassPlan, QueueSnapshot


def pass_record(
    index: int,
    snap: QueueSnapshot,
    judged: Sequence[Candidate],
    plan: PassPlan,
    admitted: Sequence[tuple[str, int]],
    decode_rows: int,
) -> dict[str, Any]:
    """One pass as plain data. ``pass``: the `index`-th planned pass; ``forward_pass``: the engine's forward-pass
    counter the policy's pass-counted knobs follow (decode-only passes included, so it can skip numbers).
    `judged`: the waiting requests the planner examined, in queue order (then those found in the short index);
    `admitted`: (rid, prefill tokens) the engine committed, continuing request included; `decode_rows`:
    decoding streams that ride along in this pass."""
    return {
        "pass": index,
        "forward_pass": snap.pass_index,
        "num_waiting": len(snap.waiting),
        "free_kv_tokens": snap.free_kv_tokens,
        "free_running_slots": snap.free_running_slots,
        "continuing": [[c.rid, c.extend_tokens, c.ctx_tokens] for c in snap.continuing],
        "num_decoding": snap.num_decoding,
        "decode_ctx_tokens": snap.decode_ctx_tokens,
        "judged": [[c.rid, c.extend_tokens, c.need_tokens] for c in judged],
        "pass_budget_tokens": plan.pass_budget_tokens,
        "sized_by": plan.sized_by,
        "pass_bound_s": plan.pass_bound_s,
        "predicted_pass_s": plan.predicted_pass_s,
        "missed_targets": list(plan.missed_targets),
        "cap_tokens": plan.cap_tokens,
        "grants": [[g.rid, g.tokens, g.cut] for g in plan.grants],
        "rejections": [[r.rid, r.need_tokens, r.rem_total_tokens, r.skipped] for r in plan.rejections],
        "admitted": [[rid, tokens] for rid, tokens in admitted],
        "decode_rows": decode_rows,
    }


class PassTraceWriter:
    """Appends records to a JSON-lines file, one ``write`` per line (several scheduler processes may share it)."""

    def __init__(self, path: Path, source: str) -> None:
        self.path = path
        self.source = source
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({"source": self.source, **record}, separators=(",", ":")) + "\n"
        os.write(self._fd, line.encode())

    def close(self) -> None:
        os.close(self._fd)


def read_pass_trace(path: Path) -> list[dict[str, Any]]:
    """Every complete record of a trace file, in order (a line still being written is left out)."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
