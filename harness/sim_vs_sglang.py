"""Simulator against reality: the same mixes through real sglang and through the simulator's engine, compared pass
by pass.

Two rule sets, each with sglang's mixed chunk off and on (`SETUPS`): the plugin (sglang 0.5.23 with the policy
core, configured to run the simulator's `fairshare` rule set for this engine) and upstream (the plugin off, its
own decisions traced by `upstream_trace`; the simulator's `baseline` rule set, which every "× baseline" figure
divides by). The mixes (`workload_mixes`) run one after another on one engine, each on an idle engine
(`run_sglang`). A batch of a mix that arrives while the mix runs lands in whichever forward pass the engine's
timing gives; the pass trace records where (`arrived`), and the simulator replays every arrival at the same
forward pass of its mix (`simulate`). The two traces are compared prefill pass by prefill pass (`pass_agreement`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cpu_env import cpu_sglang_env
from harness.pass_agreement import Agreement, compare
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
        """The simulator's rule set for this engine, and its half-prefilled-request limit. Passes are sized by the
        static knobs on both sides: SLO sizing reads the engine's measured pass costs (sglang's online fit), which
        the simulator's cost model does not replay; what the comparison checks is the engine model (slots, KV,
        the overlap scheduler) and the rules, which do not depend on how a pass size was chosen."""
        return policy_for(self.rules, CPU_TINY, mixed_decode=self.mixed_decode, slo_sizing=False)

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
    split = [batch["rid"] for batch in batches if len({seen[rid]["pass"] for rid in batch["rid"]}) > 1]
    if split:  # sglang sends a batch of token ids as one message (`TokenizerManager._send_batch_request`)
        raise ComparisonError(f"batches first seen in more than one pass: {split}")
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
    fields = type(cfg).model_fields
    wrong = {k: (v, getattr(cfg, k)) for k, v in logged.items() if k in fields and v != str(getattr(cfg, k))}
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
    forward pass sglang saw it in (a batch is one message, seen whole: `run_sglang`), or when the simulated engine
    runs dry first (it finished its work sooner)."""
    arrival = arrivals[batch[0].rid]
    return engine.drained or (not arrival.sent_idle and arrival.forward_pass <= engine.num_passes)


def compare_run(setup: Setup, mixes: Sequence[Mix], run: SglangRun, overlap_schedule: bool = True) -> Agreement:
    """sglang's run of the mixes against the simulator's replay of it."""
    sim = simulate(mixes, run.arrivals, setup, run.kv_pool_tokens, overlap_schedule)
    report = compare(setup.name, mixes, run.records, sim)
    report.num_busy_arrivals = sum(not a.sent_idle for a in run.arrivals.values())
    return report


def compare_on_sglang(model_dir: Path, mixes: Sequence[Mix], setup: Setup, work_dir: Path) -> Agreement:
    """Run the mixes through sglang and the simulator under `setup` and compare them."""
    return compare_run(setup, mixes, run_sglang(model_dir, mixes, setup, work_dir))
