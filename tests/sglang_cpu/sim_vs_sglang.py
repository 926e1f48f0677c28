"""Simulator against reality: the same deterministic workloads through real sglang (with the plugin and its
pass trace) and through the simulator's engine (`SimEngine` + `PolicyScheduler`, the same policy), compared
pass by pass.

Every request of a mix is queued before the first pass (one batch: sglang hands a batch of token ids to
its scheduler as one message); the mixes run one after another on one engine, each after the previous one
has drained, and the simulator replays the same sequence on one simulated engine. Only prefill passes are
compared (sglang's plugin plans, and traces, only passes that can admit or continue a prefill); for each:
who is admitted and with how many tokens, who is cut, how many decoding rows ride along, and who waits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.sglang_traffic import greedy, prompt_ids
from scheduler.config import PolicyConfig
from scheduler.interleave import PassKind
from scheduler.pass_trace import pass_record
from scheduler.sim.cost_model import CostModel
from scheduler.sim.engine import SimEngine
from scheduler.sim.request import SimRequest
from scheduler.sim.schedulers import PolicyScheduler


@dataclass(frozen=True)
class Mix:
    name: str
    requests: tuple[tuple[str, int, int], ...]
    """(rid, prompt tokens, output tokens) in arrival order."""


ENGINE = {"chunked_prefill_size": 256, "max_running_requests": 3, "max_total_tokens": 4096, "dtype": "float32"}
"""One sglang engine for every mix: a 256-token chunk, three running slots, a 4,096-token KV pool."""

MIXES = (
    Mix("documents-and-questions", (("dq-doc", 1500, 4), ("dq-q1", 25, 6), ("dq-q2", 40, 3))),
    Mix("kv-pressure", (("kv-doc1", 2500, 4), ("kv-doc2", 2000, 4), ("kv-q", 30, 5))),
    Mix(
        "slot-pressure",
        (("sp-q1", 30, 8), ("sp-doc", 800, 4), ("sp-q2", 45, 6), ("sp-q3", 20, 5), ("sp-q4", 60, 3)),
    ),
)


def sglang_batches(mixes: Sequence[Mix]) -> list[dict[str, Any]]:
    """One `Engine.generate` batch per mix (token ids, greedy, exact output lengths)."""
    return [
        {
            "rid": [rid for rid, _, _ in mix.requests],
            "input_ids": [prompt_ids(n, seed=sum(map(ord, rid))) for rid, n, _ in mix.requests],
            "sampling_params": [greedy(out) for _, _, out in mix.requests],
        }
        for mix in mixes
    ]


class TracedPolicyScheduler(PolicyScheduler):
    """The simulator's sglang-like scheduler, recording each pass it plans in the pass-trace form."""

    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__(cfg, max_cut_requests=1)
        self.records: list[dict[str, Any]] = []
        self._planned: tuple[Any, Any] | None = None
        plan = self.planner.plan

        def traced(snap):
            self._planned = (snap, plan(snap))
            return self._planned[1]

        self.planner.plan = traced

    def plan_step(self, engine: SimEngine):
        self._planned = None
        step = super().plan_step(engine)
        if self._planned is not None:
            snap, plan = self._planned
            rows = len(step.decode) if step.kind is PassKind.MIXED else 0
            judged = list(snap.waiting)
            admitted = [(g.rid, g.tokens) for g in plan.grants]
            self.records.append(pass_record(len(self.records), snap, judged, plan, admitted, rows))
        return step


def simulate(mixes: Sequence[Mix], cfg: PolicyConfig, kv_pool_tokens: int) -> list[dict[str, Any]]:
    """The mixes through the simulator's engine, one after another; its pass records."""
    cost = CostModel(
        name="sglang-cpu-tiny",
        fixed_s=0.01,
        prefill_tok_per_s=1e4,
        decode_row_s=1e-4,
        attn_s_per_token_ctx=0.0,
        kv_pool_tokens=kv_pool_tokens,
    )
    scheduler = TracedPolicyScheduler(cfg)
    engine = SimEngine(cost, scheduler)
    now = 0.0
    for mix in mixes:
        for rid, prompt, output in mix.requests:
            engine.add(SimRequest(rid, prompt, output, now))
        for _ in range(100_000):
            if engine.idle:
                break
            now = engine.step(now).end_s
        else:
            raise RuntimeError(f"{mix.name}: the simulated engine did not drain")
    return scheduler.records


def prefill_passes(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["admitted"]]


def pass_view(record: dict[str, Any]) -> dict[str, Any]:
    """What is compared for one prefill pass."""
    admitted = [tuple(a) for a in record["admitted"]]
    from_queue = {rid for rid, _ in admitted} - {c[0] for c in record["continuing"]}
    return {
        "admitted": admitted,
        "cut": [g[0] for g in record["grants"] if g[2]],
        "decode_rows": record["decode_rows"],
        "rejected": [r[0] for r in record["rejections"]],
        "num_waiting_after": record["num_waiting"] - len(from_queue),
    }


OVERLAP_LAG = "overlap scheduler's finishing row"
"""The known difference (docs/simulator-agreement.md): under sglang's overlap scheduler a pass is built
before the previous pass's results are processed, so a request whose last token the previous pass sampled still
rides along as a decoding row (its extra token is discarded), taking one token of a mixed pass's budget; the
simulator drops it at once. The cut request then gets that many tokens fewer, and its last chunk as many more."""


def explain(real: dict[str, Any], sim: dict[str, Any], lag_rows: int) -> str | None:
    """Why two prefill passes differ, when the difference is a known one; None otherwise. `lag_rows`: extra
    decoding rows sglang carried in this mix so far, this pass included."""
    if [r for r, _ in real["admitted"]] != [r for r, _ in sim["admitted"]] or real["cut"] != sim["cut"]:
        return None
    if real["num_waiting_after"] != sim["num_waiting_after"]:
        return None
    if set(real["rejected"]) != set(sim["rejected"]):
        # Both count a half-prefilled request's whole remaining KV as claimed (`translate.continuing_kv_tokens`),
        # so they reject the same requests.
        return None
    token_gap = max(abs(a[1] - b[1]) for a, b in zip(real["admitted"], sim["admitted"], strict=True))
    if real["decode_rows"] != sim["decode_rows"] or token_gap:
        if real["decode_rows"] < sim["decode_rows"] or token_gap > lag_rows:
            return None
        return OVERLAP_LAG
    return None


@dataclass
class Agreement:
    real_records: list[dict[str, Any]]
    real: list[dict[str, Any]]
    sim: list[dict[str, Any]]

    @property
    def pairs(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        return list(zip(self.real, self.sim, strict=False))

    @property
    def num_agree(self) -> int:
        return sum(a == b for a, b in self.pairs)

    @property
    def explained(self) -> dict[int, str]:
        """Differing passes with a known reason (`explain`)."""
        out = {}
        lag_rows, mix = 0, None
        for i, (a, b) in enumerate(self.pairs):
            mix = mix if self.real_records[i]["num_decoding"] or self.real_records[i]["continuing"] else i
            lag_rows = 0 if mix == i else lag_rows  # a mix starts on an idle engine
            lag_rows += max(0, a["decode_rows"] - b["decode_rows"])
            if a != b and (reason := explain(a, b, lag_rows)) is not None:
                out[i] = reason
        return out

    @property
    def unexplained(self) -> list[tuple[int, dict[str, Any], dict[str, Any] | None]]:
        explained = self.explained
        diffs = [(i, a, b) for i, (a, b) in enumerate(self.pairs) if a != b and i not in explained]
        longer = self.real if len(self.real) > len(self.sim) else self.sim
        return diffs + [(i, longer[i], None) for i in range(len(self.pairs), len(longer))]

    def summary(self) -> str:
        reasons = Counter(self.explained.values())
        lines = [
            f"prefill passes: sglang {len(self.real)}, simulator {len(self.sim)}; identical {self.num_agree}; "
            + "".join(f"differing only by the {r}: {n}; " for r, n in sorted(reasons.items()))
            + f"unexplained {len(self.unexplained)}"
        ]
        for i, a, b in self.unexplained[:10]:
            lines.append(f"  pass {i}: sglang {a}\n          sim    {b}")
        return "\n".join(lines)


def agreement(real_records: Sequence[dict[str, Any]], sim_records: Sequence[dict[str, Any]]) -> Agreement:
    real = prefill_passes(real_records)
    return Agreement(real, [pass_view(r) for r in real], [pass_view(r) for r in prefill_passes(sim_records)])
