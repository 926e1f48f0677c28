"""Simulator against reality: the same mixes through real sglang and through the simulator's engine, compared pass
by pass.

Two rule sets, each with sglang's mixed chunk off and on (`SETUPS`): the plugin (sglang 0.5.23 with the policy
core, configured to run the simulator's `fairshare` rule set for this engine) and upstream (the plugin off, its
own decisions traced by `upstream_trace`; the simulator's `baseline` rule set, which every "× baseline" figure
divides by). The mixes (`workload_mixes`) run one after another on one engine, each on an idle engine
(`run_sglang`). A batch of a mix that arrives while the mix runs lands in whichever forward pass the engine's
timing gives; the pass trace records where (`arrived`), and the simulator replays every arrival at the same
forward pass of its mix (`simulate`). Only prefill passes are compared, mix by mix: for each, who is admitted and
with how many tokens, who is cut, how many decoding rows ride along, who is rejected for KV capacity, and how many
requests wait after it (`pass_view`).
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cpu_env import cpu_sglang_env
from harness.sglang_engine import run_engine
from harness.sglang_traffic import FIRST_WORD_ID, greedy, prompt_ids
from harness.workload_mixes import EngineLimits, Mix, MixRequest
from scheduler.config import PolicyConfig
from scheduler.interleave import PassKind
from scheduler.pass_trace import ArrivalLog, pass_record, read_pass_trace
from scheduler.sim.cost_model import CostModel
from scheduler.sim.engine import SimEngine
from scheduler.sim.presets import Preset
from scheduler.sim.request import SimRequest
from scheduler.sim.rules import RuleSet, policy_for
from scheduler.sim.schedulers import PolicyScheduler

LIMITS = EngineLimits()
ENGINE = {
    "chunked_prefill_size": LIMITS.chunk_tokens,
    "max_running_requests": LIMITS.max_running_requests,
    "max_total_tokens": LIMITS.kv_pool_tokens,
    "dtype": "float32",
}
"""One sglang engine for every mix: a 256-token chunk, three running slots, a 4,096-token KV pool."""

CPU_TINY = Preset(
    name="sglang-cpu-tiny",
    cost=CostModel(
        name="sglang-cpu-tiny",
        fixed_s=0.01,
        prefill_tok_per_s=1e4,
        decode_row_s=1e-4,
        attn_s_per_token_ctx=0.0,
        kv_pool_tokens=LIMITS.kv_pool_tokens,
        notes="Decisions only: the comparison counts passes, never their time.",
    ),
    chunk_budget_tokens=LIMITS.chunk_tokens,
    baseline_chunk_tokens=LIMITS.chunk_tokens,
    max_running_requests=LIMITS.max_running_requests,
    description="The tiny CPU engine the simulator is compared with (`ENGINE`).",
)
VOCAB_WORDS = 1_000 - FIRST_WORD_ID
"""Distinct first tokens the tiny tokenizer has: at most this many requests per engine run."""


@dataclass(frozen=True)
class Setup:
    """One engine configuration to compare: the rule set (plugin on: `fairshare`; off: `baseline`) and mixed chunk."""

    rules: RuleSet
    mixed_decode: bool

    @property
    def plugin(self) -> bool:
        return self.rules is RuleSet.FAIRSHARE

    @property
    def name(self) -> str:
        side = "plugin / fairshare" if self.plugin else "upstream / baseline"
        return f"{side}, mixed chunk {'on' if self.mixed_decode else 'off'}"

    def policy(self) -> tuple[PolicyConfig, int]:
        """The simulator's rule set for this engine, and its half-prefilled-request limit."""
        return policy_for(self.rules, CPU_TINY, mixed_decode=self.mixed_decode)

    def env(self, trace: Path) -> dict[str, str]:
        if not self.plugin:
            return cpu_sglang_env(plugin_enabled=False, pass_trace=trace)
        cfg, _ = self.policy()
        return cpu_sglang_env(pass_trace=trace, **policy_env(cfg))

    def engine_kwargs(self) -> dict[str, Any]:
        # With the plugin on, FAIRSHARE_MIXED_DECODE sets sglang's mixed chunk (`server_args`); off, sglang's flag.
        return ENGINE if self.plugin else {**ENGINE, "enable_mixed_chunk": self.mixed_decode}


SETUPS = tuple(Setup(rules, mixed) for rules in (RuleSet.FAIRSHARE, RuleSet.BASELINE) for mixed in (False, True))


def policy_env(cfg: PolicyConfig) -> dict[str, object]:
    """The ``FAIRSHARE_*`` switches that make the plugin run `cfg`: every field off its default, and mixed decode."""
    fields = PolicyConfig.model_fields
    return {
        name: value
        for name, value in cfg.model_dump().items()
        if name == "mixed_decode" or value != fields[name].default
    }


def request_prompt(index: int, rid: str, tokens: int) -> list[int]:
    """Random token ids whose first token no other request of the run has, so none hits another's cached prefix
    (sglang's radix cache matches from the first token). `index`: the request's place in the run."""
    if index >= VOCAB_WORDS:
        raise ValueError(f"at most {VOCAB_WORDS} requests per engine run: split the mixes over more runs")
    ids = prompt_ids(tokens, seed=zlib.crc32(rid.encode()))
    ids[0] = FIRST_WORD_ID + index
    return ids


def sglang_batches(mixes: Sequence[Mix]) -> list[dict[str, Any]]:
    """Each mix as one group of `Engine` batches (`sglang_engine_driver`): token ids, greedy, exact output lengths."""
    batches = []
    index = 0
    for group, mix in enumerate(mixes):
        for batch, after in enumerate(mix.after_passes):
            reqs = mix.batch(batch)
            prompts = [request_prompt(index + i, r.rid, r.prompt_tokens) for i, r in enumerate(reqs)]
            index += len(reqs)
            batches.append(
                {
                    "rid": [r.rid for r in reqs],
                    "input_ids": prompts,
                    "sampling_params": [greedy(r.output_tokens) for r in reqs],
                    "group": group,
                    "after_passes": after,
                }
            )
    return batches


@dataclass(frozen=True)
class Arrival:
    forward_pass: int
    """sglang's forward-pass count when its scheduler first saw the request waiting (from the pass trace)."""
    sent_idle: bool
    """Sent to an engine with nothing left to run (its batch waited for every request before it to finish)."""
    finishing_seen: bool = True
    """That pass saw requests whose last token was in flight (their results not processed yet)."""


@dataclass
class SglangRun:
    records: list[dict[str, Any]]
    arrivals: dict[str, Arrival]
    kv_pool_tokens: int
    log: str


class ComparisonError(RuntimeError):
    pass


def run_sglang(
    model_dir: Path, mixes: Sequence[Mix], setup: Setup, work_dir: Path, timeout_s: float = 900
) -> SglangRun:
    """The mixes through one fresh sglang engine; its pass trace and where each request arrived. Checks that every
    request produced exactly its output and, with the plugin on, that the plugin runs the simulator's config."""
    trace = work_dir / "passes.jsonl"
    trace.unlink(missing_ok=True)
    batches = sglang_batches(mixes)
    result = run_engine(
        model_dir,
        batches,
        setup.env(trace),
        work_dir / "engine",
        engine_kwargs=setup.engine_kwargs(),
        server_info=True,
        timeout_s=timeout_s,
        pass_trace=trace,
    )
    want = {r.rid: r.output_tokens for mix in mixes for r in mix.requests}
    got = {o["meta_info"]["id"]: len(o["output_ids"]) for batch in result["outputs"] for o in batch}
    if got != want:
        raise ComparisonError(
            f"sglang's outputs differ from the mixes': {sorted(set(got.items()) ^ set(want.items()))}"
        )
    log = (work_dir / "engine" / "engine.log").read_text(errors="replace")
    if setup.plugin:
        check_plugin_config(log, setup.policy()[0])
    elif "fairshare policy: " in log:
        raise ComparisonError("the plugin attached to an engine that should run upstream's rules")
    records = read_pass_trace(trace)
    seen = {rid: r for r in records for rid in r["arrived"]}
    missing = sorted(set(want) - set(seen))
    if missing:
        raise ComparisonError(f"the sglang trace shows no arrival of {missing}")
    idle = {
        rid: sent_idle for batch, sent_idle in zip(batches, result["sent_idle"], strict=True) for rid in batch["rid"]
    }
    arrivals = {rid: Arrival(seen[rid]["forward_pass"], idle[rid], bool(seen[rid]["finishing"])) for rid in want}
    return SglangRun(records, arrivals, int(result["server_info"]["max_total_num_tokens"]), log)


def check_plugin_config(log: str, cfg: PolicyConfig) -> None:
    """The plugin's start-up line (``fairshare policy: key=value ...``) shows every field as `cfg` has it."""
    lines = [line for line in log.splitlines() if "fairshare policy: " in line]
    if len(lines) != 1:
        raise ComparisonError(f"expected one plugin start-up line, found {len(lines)}")
    logged = dict(item.split("=", 1) for item in lines[0].split("fairshare policy: ", 1)[1].split() if "=" in item)
    wrong = {k: (v, getattr(cfg, k)) for k, v in logged.items() if k in cfg.model_fields and v != str(getattr(cfg, k))}
    if wrong:
        raise ComparisonError(f"the plugin runs another config than the simulator (logged, simulated): {wrong}")


class TracedPolicyScheduler(PolicyScheduler):
    """The simulator's sglang-like scheduler, recording each pass it plans in the pass-trace form."""

    def __init__(self, cfg: PolicyConfig, max_cut_requests: int, overlap_schedule: bool = True) -> None:
        super().__init__(cfg, max_cut_requests=max_cut_requests, overlap_schedule=overlap_schedule)
        self.records: list[dict[str, Any]] = []
        self.arrivals = ArrivalLog()
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
            admitted = [(g.rid, g.tokens) for g in plan.grants]
            arrived = self.arrivals.arrived(r.rid for r in engine.waiting)
            finishing = [r.rid for r in engine.finishing]
            judged = list(snap.waiting)
            self.records.append(pass_record(len(self.records), snap, judged, plan, admitted, rows, arrived, finishing))
        return step


def simulate(
    mixes: Sequence[Mix],
    arrivals: dict[str, Arrival],
    setup: Setup,
    kv_pool_tokens: int,
    overlap_schedule: bool = True,
) -> list[dict[str, Any]]:
    """The mixes through the simulator's engine, one after another, each request arriving where it arrived in
    sglang (`arrivals`); the simulator's pass records. A batch sent to an idle sglang engine arrives once the
    simulated engine has nothing left to run either; another arrives at the forward pass sglang saw it in. Where
    sglang had processed the results of the pass before when it first saw the batch (no request was finishing), so
    has the simulator (a batch can land in the idle iteration that processes them). Each mix starts at sglang's
    forward-pass count (an idle engine's count does not move), so the pass-counted knobs see the same counts and a
    difference in one mix does not shift the next.
    `overlap_schedule`: model sglang's overlap event loop (its default, and what the CPU engine runs)."""
    cfg, max_cut = setup.policy()
    scheduler = TracedPolicyScheduler(cfg, max_cut, overlap_schedule)
    engine = SimEngine(CPU_TINY.cost.model_copy(update={"kv_pool_tokens": kv_pool_tokens}), scheduler)
    now = 0.0
    for mix in mixes:
        engine.num_passes = arrivals[mix.requests[0].rid].forward_pass
        pending = [mix.batch(b) for b in range(len(mix.after_passes))]
        for _ in range(100_000):
            while pending and arrives(pending[0], arrivals, engine):
                batch = pending.pop(0)
                if not arrivals[batch[0].rid].finishing_seen:
                    engine.process_results()
                for r in batch:
                    engine.add(SimRequest(r.rid, r.prompt_tokens, r.output_tokens, now))
            if engine.idle:
                break
            now = engine.step(now).end_s
        else:
            raise ComparisonError(f"{mix.name}: the simulated engine did not drain")
    return scheduler.records


def arrives(batch: Sequence[MixRequest], arrivals: dict[str, Arrival], engine: SimEngine) -> bool:
    """Is the batch in the engine's queue before its next pass? One sent to a busy sglang engine comes at the
    forward pass sglang saw it in (its first request's: a batch is one message), or when the simulated engine runs
    dry first (it finished its work sooner)."""
    arrival = arrivals[batch[0].rid]
    return engine.drained or (not arrival.sent_idle and arrival.forward_pass <= engine.num_passes)


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


KV_BOOKKEEPING = "KV bookkeeping"
"""sglang's admission counts KV a few tokens apart from the simulator's: a request's need one page more
(`PrefillAdder.per_req_token_overhead`), free KV only below its remaining total, the half-prefilled request's
remainder one page more, one token per row of the running batch when mixed chunk is on (`num_mixed_decode_tokens`),
and one token less for a stream the pass in flight does not decode (its next token needs no KV yet). A request
judged within `kv_window` tokens of fitting can fit on one side and not on the other."""
AFTER = "after "
"""Prefix of the reason of a later differing pass of a mix whose first difference has a known reason."""


def kv_window(record: dict[str, Any], num_admitted_before: int) -> int:
    """How far apart sglang's and the simulator's margins (free KV less need) of one request can be: the page of its
    need and of each request admitted before it in the pass, the strict comparison, the continuing request's page,
    and a token per stream of the running batch."""
    return 3 + num_admitted_before + record["num_decoding"]


def from_queue(record: dict[str, Any]) -> list[str]:
    continuing = {c[0] for c in record["continuing"]}
    return [rid for rid, _ in record["admitted"] if rid not in continuing]


def margins(record: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Each judged request's free KV less its need when the scan reached it (the free KV of the pass less what the
    requests admitted before it took), in the record's own figures, and how many were admitted before it."""
    admitted = set(from_queue(record))
    free, before = record["free_kv_tokens"], 0
    out = {}
    for rid, _, need in record["judged"]:
        out[rid] = (free - need, before)
        if rid in admitted:
            free, before = free - need, before + 1
    return out


def explain(real: dict[str, Any], sim: dict[str, Any]) -> str | None:
    """Why the first differing pass of a mix differs, when the reason is a known one; None otherwise. Both records
    are the passes' raw records."""
    fate_real = {rid: rid in set(from_queue(real)) for rid, *_ in real["judged"]}
    fate_sim = {rid: rid in set(from_queue(sim)) for rid, *_ in sim["judged"]}
    first = next((rid for rid in fate_real if rid in fate_sim and fate_real[rid] != fate_sim[rid]), None)
    if first is None:
        return None
    margin, before = margins(sim)[first]
    if abs(margin) <= max(kv_window(real, before), kv_window(sim, before)):
        return KV_BOOKKEEPING
    return None


@dataclass
class MixComparison:
    mix: str
    real_records: list[dict[str, Any]]
    """sglang's prefill passes of the mix (raw pass records)."""
    sim_records: list[dict[str, Any]]

    @property
    def real(self) -> list[dict[str, Any]]:
        return [pass_view(r) for r in self.real_records]

    @property
    def sim(self) -> list[dict[str, Any]]:
        return [pass_view(r) for r in self.sim_records]

    @property
    def pairs(self) -> list[tuple[dict[str, Any] | None, dict[str, Any] | None]]:
        return [(a and pass_view(a), b and pass_view(b)) for a, b in self.record_pairs]

    @property
    def record_pairs(self) -> list[tuple[dict[str, Any] | None, dict[str, Any] | None]]:
        longer = max(len(self.real_records), len(self.sim_records))
        pad = [None] * longer
        return list(zip([*self.real_records, *pad][:longer], [*self.sim_records, *pad][:longer], strict=True))

    @property
    def num_passes(self) -> int:
        """The passes compared: sglang's, or the simulator's where it took more."""
        return max(len(self.real_records), len(self.sim_records))

    @property
    def num_identical(self) -> int:
        return sum(a == b for a, b in self.pairs)

    def differences(self) -> list[tuple[int, dict[str, Any] | None, dict[str, Any] | None, str | None]]:
        """(pass of the mix, sglang's view, the simulator's, the reason or None) for every differing pass. The first
        difference of a mix is judged by `explain`; the passes after it differ because of it (``after ...``), or
        stay unexplained with it."""
        out: list[tuple[int, dict[str, Any] | None, dict[str, Any] | None, str | None]] = []
        cause: str | None = None
        for i, (a, b) in enumerate(self.record_pairs):
            va, vb = a and pass_view(a), b and pass_view(b)
            if va == vb:
                continue
            if not out:
                cause = explain(a, b) if a is not None and b is not None else None
                out.append((i, va, vb, cause))
            else:
                out.append((i, va, vb, None if cause is None else AFTER + cause))
        return out

    def margin_gaps(self) -> list[tuple[int, int]]:
        """For each request judged by both sides in an identical pass: how far sglang's margin (free KV less need)
        is from the simulator's, and the `kv_window` that `KV_BOOKKEEPING` assumes it within."""
        out = []
        for a, b in self.record_pairs:
            if a is None or b is None or pass_view(a) != pass_view(b):
                continue
            ours = margins(b)
            out += [(m - ours[rid][0], kv_window(a, k)) for rid, (m, k) in margins(a).items() if rid in ours]
        return out


@dataclass
class Agreement:
    setup: str
    mixes: list[MixComparison] = field(default_factory=list)
    arrivals: dict[str, Arrival] = field(default_factory=dict)
    """Where sglang saw each request arrive."""

    @property
    def num_busy_arrivals(self) -> int:
        """Requests that arrived while their mix ran (staggered batches sent to a busy engine)."""
        return sum(not a.sent_idle for a in self.arrivals.values())

    @property
    def num_passes(self) -> int:
        return sum(m.num_passes for m in self.mixes)

    @property
    def num_identical(self) -> int:
        return sum(m.num_identical for m in self.mixes)

    @property
    def share_identical(self) -> float:
        return self.num_identical / self.num_passes if self.num_passes else 1.0

    @property
    def explained(self) -> Counter[str]:
        return Counter(reason for m in self.mixes for *_, reason in m.differences() if reason is not None)

    @property
    def unexplained(self) -> list[tuple[str, int, dict[str, Any] | None, dict[str, Any] | None]]:
        return [(m.mix, i, a, b) for m in self.mixes for i, a, b, reason in m.differences() if reason is None]

    def summary(self, max_listed: int = 10) -> str:
        reasons = "".join(f"differing only by {r}: {n}; " for r, n in sorted(self.explained.items()))
        lines = [
            f"{self.setup}: {len(self.mixes)} mixes, prefill passes compared {self.num_passes} "
            f"(sglang {sum(len(m.real) for m in self.mixes)}, simulator {sum(len(m.sim) for m in self.mixes)}); "
            f"identical {self.num_identical} ({100 * self.share_identical:.1f}%); {reasons}"
            f"unexplained {len(self.unexplained)}"
        ]
        for mix, i, a, b in self.unexplained[:max_listed]:
            lines.append(f"  {mix} pass {i}: sglang {a}\n  {' ' * len(mix)}        sim    {b}")
        return "\n".join(lines)


def compare(
    setup: Setup, mixes: Sequence[Mix], real_records: Sequence[dict[str, Any]], sim_records: Sequence[dict[str, Any]]
) -> Agreement:
    """Pair the prefill passes of each mix (a pass belongs to the mix of the requests it admits; passes of other
    mixes are left out)."""
    mix_of = {r.rid: mix.name for mix in mixes for r in mix.requests}

    def by_mix(records: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {mix.name: [] for mix in mixes}
        for record in prefill_passes(records):
            if (mix := mix_of.get(record["admitted"][0][0])) is not None:
                out[mix].append(record)
        return out

    real, sim = by_mix(real_records), by_mix(sim_records)
    return Agreement(setup.name, [MixComparison(mix.name, real[mix.name], sim[mix.name]) for mix in mixes])


def compare_run(setup: Setup, mixes: Sequence[Mix], run: SglangRun, overlap_schedule: bool = True) -> Agreement:
    """sglang's run of the mixes against the simulator's replay of it."""
    sim = simulate(mixes, run.arrivals, setup, run.kv_pool_tokens, overlap_schedule)
    report = compare(setup, mixes, run.records, sim)
    report.arrivals = dict(run.arrivals)
    return report


def compare_on_sglang(model_dir: Path, mixes: Sequence[Mix], setup: Setup, work_dir: Path) -> Agreement:
    """Run the mixes through sglang and the simulator under `setup` and compare them."""
    return compare_run(setup, mixes, run_sglang(model_dir, mixes, setup, work_dir))
