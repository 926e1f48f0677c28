"""The structured pass trace: one JSON line per planned pass, and one per timed pass, written only when asked.

One record per pass that the policy planned: a summary of the snapshot (waiting requests, free KV and
running slots, the half-prefilled request, decoding streams), the requests the planner judged, the plan
(pass budget, F, grants, capacity rejections), what the engine actually committed, the requests that joined the
waiting queue since the pass before (`ArrivalLog`) and, from an engine that fits its pass-cost model online, that
model as it stood (`pass_cost`). The sglang plugin writes it when ``FAIRSHARE_PASS_TRACE`` names a file (with the
plugin off, `sglang_plugin.upstream_trace` writes upstream's own decisions in the same form); the simulator's
engine produces the same records, so a real sglang run and a simulated one compare pass by pass
(`read_pass_trace`). Nothing is built or formatted when off.

The plugin also records every forward pass it timed (`timing_record`, read with `read_pass_timings`): its
figures, its measured seconds and what the model in force predicted for it, decode-only passes included.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence
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
    arrived: Sequence[str] = (),
    finishing: Sequence[str] = (),
    pass_cost: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One pass as plain data. ``pass``: the `index`-th planned pass; ``forward_pass``: the engine's forward-pass
    counter the policy's pass-counted knobs follow (decode-only passes included, so it can skip numbers).
    `judged`: the waiting requests the planner examined, in queue order (then those found in the short index);
    `admitted`: (rid, prefill tokens) the engine committed, continuing request included; `decode_rows`:
    decoding streams that ride along in this pass (not those whose last token is still in flight, which sglang's
    overlap scheduler leaves out); `arrived`: requests waiting now that were not at the last traced pass;
    `finishing`: running requests whose last token is in flight (the overlap scheduler has not processed the pass
    before yet), which still hold their slot and KV; `pass_cost`: the engine's online pass-cost fit as it stood
    (`OnlinePassCost.describe`), when it has one."""
    record: dict[str, Any] = {
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
        "arrived": list(arrived),
        "finishing": list(finishing),
    }
    if pass_cost is not None:
        record["pass_cost"] = pass_cost
    return record


def timing_record(
    forward_pass: int,
    prefill_tokens: int,
    prefill_ctx_pairs: float,
    decode_rows: int,
    decode_ctx_tokens: int,
    measured_s: float,
    predicted_s: float,
) -> dict[str, Any]:
    """One timed forward pass: the engine's forward-pass counter, its `PassCost` figures, the seconds it measured
    and the seconds the model in force predicted before it learned from the pass."""
    return {
        "timed_pass": forward_pass,
        "prefill_tokens": prefill_tokens,
        "prefill_ctx_pairs": prefill_ctx_pairs,
        "decode_rows": decode_rows,
        "decode_ctx_tokens": decode_ctx_tokens,
        "measured_s": measured_s,
        "predicted_s": predicted_s,
    }


class ArrivalLog:
    """Which waiting requests are new since the last traced pass. A request joins the queue between two passes
    and leaves it only when a planned (so traced) pass admits it, so the queue at the start of each traced pass,
    less the queue at the start of the traced pass before, is what arrived in between."""

    def __init__(self) -> None:
        self._last: set[str] = set()

    def arrived(self, waiting_rids: Iterable[str]) -> list[str]:
        """`waiting_rids`: the waiting queue at the start of this traced pass, in queue order."""
        now = list(waiting_rids)
        new = [rid for rid in now if rid not in self._last]
        self._last = set(now)
        return new


class PassTraceWriter:
    """Appends records to a JSON-lines file, one ``write`` per line (several scheduler processes may share it: each
    line names its `source`, its process (``pid``) and when it was written (``at``, Unix seconds), so one engine's
    passes line up with the requests a client timed)."""

    def __init__(self, path: Path, source: str) -> None:
        self.path = path
        self.source = source
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        stamp = {"source": self.source, "pid": os.getpid(), "at": time.time()}
        line = json.dumps({**stamp, **record}, separators=(",", ":")) + "\n"
        os.write(self._fd, line.encode())

    def close(self) -> None:
        os.close(self._fd)


def read_pass_trace(path: Path) -> list[dict[str, Any]]:
    """Every complete planned-pass record of a trace file, in order (a line still being written is left out)."""
    return [r for r in _records(path) if "pass" in r]


def read_pass_timings(path: Path) -> list[dict[str, Any]]:
    """Every complete timed-pass record (`timing_record`) of a trace file, in order."""
    return [r for r in _records(path) if "timed_pass" in r]


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
