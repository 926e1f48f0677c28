"""A small mutation check of the policy core, SLO sizing and the lane router: does some test fail when a rule breaks?

Each mutant replaces one exact snippet of one source file (the snippet must occur exactly once) and
runs the tests that guard that code in a scratch copy of the repository (the working tree is never
touched). A mutant is *killed* when those tests fail. Prints one line per mutant and the kill rate.

    python tests/mutation_check.py              # all mutants
    python tests/mutation_check.py R3 C1        # some of them
    python tests/mutation_check.py --list

A mutant whose snippet is no longer in the source is reported `stale` (the code changed: update the
list) and left out of the rate. Not a pytest module (it runs pytest itself), so not collected.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COPIED = (
    "scheduler",
    "serve_app",
    "tests",
    "benchmarks",
    "harness",
    "pyproject.toml",
    "config.yaml",
    "config.card12gb.yaml",
)

CORE_TESTS = (
    "tests/test_admission.py",
    "tests/test_fair_share.py",
    "tests/test_pass_budget.py",
    "tests/test_config.py",
    "tests/test_sim_engine.py",
    "tests/test_fcfs_reference.py",
    "tests/test_ledger.py",
    "tests/test_interleave.py",
    "tests/test_traffic.py",
)
ROUTING_TESTS = (
    "tests/serve/test_routing.py",
    "tests/serve/test_placement.py",
    "tests/serve/test_prefix_pages.py",
    "tests/serve/test_sim_backend.py",
)
SLO_TESTS = ("tests/test_slo_sizing.py", "tests/test_slo.py")


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str
    old: str
    new: str
    what: str
    tests: tuple[str, ...]


PLACEMENT = "serve_app/routing/placement.py"
PREFIXES = "serve_app/routing/prefix_pages.py"


def _r(id: str, old: str, new: str, what: str, path: str = "serve_app/routing/lane_policy.py") -> Mutant:
    return Mutant(id, path, old, new, what, ROUTING_TESTS)


def _lc(id: str, old: str, new: str, what: str) -> Mutant:
    return _r(id, old, new, what, "serve_app/routing/load_correction.py")


def _c(id: str, path: str, old: str, new: str, what: str) -> Mutant:
    return Mutant(id, path, old, new, what, CORE_TESTS)


def _s(id: str, old: str, new: str, what: str, path: str = "scheduler/slo_sizing.py") -> Mutant:
    return Mutant(id, path, old, new, what, SLO_TESTS)


MUTANTS = [
    # -- the router's load correction (published load + what this router knows happened since) --------
    _lc("R1", "gone = [rid for rid in view.pending if rid in completed]", "gone = []", "finished pending kept"),
    _lc("R2", "e.decided_s > view.stats_time_s - ARRIVAL_MARGIN_S", "e.decided_s > view.stats_time_s", "no margin"),
    _lc("R3", "and e.request_id not in view.pending\n    ]", "\n    ]", "published sends counted twice"),
    _lc("R4", "num_gone_prefilling = min(len(gone), num_prefilling)", "num_gone_prefilling = 0", "gone from waiting"),
    _lc(
        "R5", "view.load.prefill_tokens - sum(view.pending[r] for r in gone)", "view.load.prefill_tokens", "gone tokens"
    ),
    _lc("R6", "+ sum(e.uncached_tokens for e in sent)", "", "sent tokens not added"),
    _lc(
        "R7",
        "num_waiting = view.load.num_waiting + len(sent)",
        "num_waiting = view.load.num_waiting",
        "sent not waiting",
    ),
    _r("R8", "self._completed[entry.request_id] = (entry, now_s)", "pass", "completions not remembered"),
    _lc(
        "R8b",
        "num_decoding=max(0, view.load.num_decoding - ended)",
        "num_decoding=view.load.num_decoding",
        "ended kept",
    ),
    _lc("R8c", "e.decided_s <= cutoff and ", "", "ended decoding: no arrival margin"),
    # -- the decision ----------------------------------------------------------------------------------
    _r("R9", "threshold = int(threshold * (1 - hysteresis))", "pass", "no hysteresis", "scheduler/traffic.py"),
    _r(
        "R10",
        "uncached_prompt_tokens <= threshold",
        "uncached_prompt_tokens < threshold",
        "off by one",
        "scheduler/traffic.py",
    ),
    _r(
        "R11",
        "load.prefill_tokens >= self.knobs.busy_prefill_tokens",
        "load.prefill_tokens > self.knobs.busy_prefill_tokens",
        "busy bound",
        PLACEMENT,
    ),
    _r(
        "R12",
        "(self.knobs.chat_spill and self.chat_saturated)",
        "self.chat_saturated",
        "chat_spill=false ignored",
        PLACEMENT,
    ),
    _r(
        "R13",
        "od.get(page, UNFINISHED) >= published_s",
        "page in od",
        "what was sent outlives the engine's word",
        PREFIXES,
    ),
    _r("P6", "od[p] = od.get(p, UNFINISHED)", "od[p] = 0.0", "a prompt in flight counts as cached", PREFIXES),
    _r(
        "R14",
        "stays = not c.busy(pinned, pinned_cls) or not better",
        "stays = not c.busy(pinned, pinned_cls)",
        "gives way to worse",
    ),
    _r("R15", "if now_s - rec.last_used_s <= knobs.session_ttl_s:", "if True:", "sessions never expire"),
    _r(
        "R16",
        "return v.lane is Lane.LONG or not self.has_long_lane",
        "return v.lane is Lane.LONG",
        "no lane fallback",
        PLACEMENT,
    ),
    _r(
        "R17",
        "self.short_request_tokens = _agreed_threshold(usable)",
        "self.short_request_tokens = 2048",
        "the replica's published threshold ignored",
        PLACEMENT,
    ),
    # -- lanes that follow the load ----------------------------------------------------------------------
    _r(
        "R18",
        "return self.over_target(v) or load.num_pending",
        "return load.num_pending",
        "a chat's predicted TTFT never makes a replica busy",
        PLACEMENT,
    ),
    _r("R19", "not self.keeps_chat_slo(v),", "False,", "documents ignore the chat SLO", PLACEMENT),
    _r("R20", "ready = [v for v in views if v.load.ready]", "ready = list(views)", "loading replicas get requests"),
    _r("R21", "and c.faster(v, pinned)]", "]", "a follow-up leaves its cache for a slower first token"),
    _r(
        "R24",
        "stays = not c.busy(pinned, pinned_cls) or not better",
        "stays = not better",
        "a chat leaves its cache for a faster replica while its first token there is within the target",
    ),
    _r(
        "R22",
        "if load.short_first:",
        "if True:",
        "every engine taken to overtake",
        "serve_app/routing/ttft_prediction.py",
    ),
    _r(
        "R23",
        "by_load = (_or_inf(self.predicted_ttft_s(v)),",
        "by_load = (0.0,",
        "chats not placed by predicted TTFT",
        PLACEMENT,
    ),
    # -- placement by cached prefix ------------------------------------------------------------------------
    _r("P1", "if held(pages[mid - 1]):", "if held(pages[0]):", "a prompt's held prefix misjudged", PREFIXES),
    _r("P2", "for p in reversed(list(pages)):", "for p in pages:", "the sent record loses a prompt's start", PREFIXES),
    _r(
        "P3",
        "if len(holders) == 1:",
        "if holders:",
        "a prefix every replica holds pins one",
        "serve_app/routing/lane_policy.py",
    ),
    _r(
        "P4", "self._sent.sent(d.replica_id, hint.prefix_pages)", "pass", "what was sent is not counted until published"
    ),
    _r(
        "P5",
        "self._held.move_to_end(page)\n            page = self._parent.get(page)",
        "page = self._parent.get(page)",
        "a bounded publication keeps a prefix without its start",
        "serve_app/replica/held_prefixes.py",
    ),
    # -- the policy core -------------------------------------------------------------------------------
    _c(
        "C1",
        "scheduler/admission.py",
        "if len(self.first_skipped) > self.max_entries:",
        "if False:",
        "ledger never pruned",
    ),
    _c("C2", "scheduler/admission.py", "if r in alive_rids}", "}", "ledger prune keeps the dead"),
    _c("C3", "scheduler/planner.py", "self.ledger.forget(g.rid)", "pass", "admitted requests keep their skips"),
    _c(
        "C4",
        "scheduler/interleave.py",
        "if num_decoding and self.decode_passes_owed > 0:",
        "if self.decode_passes_owed > 0:",
        "decode-only pass with no decoders",
    ),
    _c(
        "C5",
        "scheduler/interleave.py",
        "return PassKind.DECODE if num_decoding else PassKind.IDLE",
        "return PassKind.DECODE",
        "decode pass when idle",
    ),
    _c(
        "C6",
        "scheduler/interleave.py",
        "PassKind.MIXED if cfg.mixed_decode and num_decoding else",
        "PassKind.MIXED if cfg.mixed_decode else",
        "mixed with no decoders",
    ),
    _c(
        "C7",
        "scheduler/admission.py",
        "if self._num_examined_after_rejection >= self._cfg.lookahead:",
        "if self._num_examined_after_rejection > self._cfg.lookahead:",
        "lookahead off by one",
    ),
    _c(
        "C8",
        "scheduler/admission.py",
        "return False  # strict FCFS",
        "return True  # strict FCFS",
        "FCFS switch ignored",
    ),
    _c(
        "C9",
        "scheduler/admission.py",
        "return not self._reserved_ahead or short",
        "return not self._reserved_ahead",
        "shorts blocked by a reservation",
    ),
    _c(
        "C10",
        "scheduler/admission.py",
        "return first is not None and pass_index - first >= cfg.max_skipped_passes",
        "return first is not None and pass_index - first > cfg.max_skipped_passes",
        "reservation one pass late",
    ),
    _c(
        "C11",
        "scheduler/config.py",
        "return max(1, self.chunk_budget_tokens // self.prefill_concurrency)",
        "return max(1, self.chunk_budget_tokens // self.max_running_requests)",
        "F from N without the 2x",
    ),
    _c(
        "C12",
        "scheduler/traffic.py",
        "return TrafficClass.SHORT if uncached_prompt_tokens <= threshold else TrafficClass.LONG",
        "return TrafficClass.SHORT if uncached_prompt_tokens < threshold else TrafficClass.LONG",
        "short threshold off by one",
    ),
    Mutant(
        "C13",
        "scheduler/planner.py",
        "!= plan.pass_budget_tokens:",
        "!= plan.pass_budget_tokens and False:",
        "an idle plan repeated past a change of its pass budget",
        ("tests/test_replay_idle.py", "tests/sglang/test_sglang_idle_scan.py"),
    ),
    Mutant(
        "C14",
        "scheduler/sglang_plugin/idle_scan.py",
        "self.engine[2] if running_now == self.running else",
        "self.engine[2] if True else",
        "the scan's short-stream count kept for other running requests",
        ("tests/sglang/test_sglang_idle_scan.py",),
    ),
    # -- SLO-driven pass sizing and the SLO definition -------------------------------------------------
    _s(
        "S1",
        "    if load.num_short_decoding <= reserve:\n        return False\n",
        "",
        "passes shrink for slots that documents hold",
        "scheduler/pass_budget.py",
    ),
    _s(
        "S2",
        "return (ttft_target_s - own_pass_s - after_s) / (1 + admission_lag_passes) - decode_pass_s",
        "return ttft_target_s - own_pass_s - after_s - decode_pass_s",
        "the passes an engine plans ahead ignored",
    ),
    _s(
        "S3",
        "left_s = cfg.planned_ttft_s - ahead * charge * waited_pass_s - after_s",
        "left_s = cfg.planned_ttft_s - after_s",
        "the admitted chat's wait ignored",
    ),
    _s(
        "S4",
        "bounds.append(_Bound(cfg.planned_tbt_s - decode_pass_s, SizedBy.TBT, Target.TBT))",
        "pass",
        "the TBT target ignored",
    ),
    _s(
        "S5",
        "math.ceil(CHAT_PROMPT_QUANTILE * len(ordered)) - 1",
        "len(ordered) - 1",
        "the TTFT reserve is the largest prompt seen",
    ),
    _s("S6", "if missed:", "if False:", "a target no pass keeps goes unreported"),
    _s(
        "S7",
        "if worst is not None and worst > targets.tbt_s:",
        "if False:",
        "a stream's gaps not judged",
        "scheduler/slo.py",
    ),
]


def _scratch_copy(dst: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.pyc")
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dst / name)


def run_mutant(m: Mutant, scratch: Path, timeout_s: float) -> str:
    target = scratch / m.path
    original = target.read_text()
    if original.count(m.old) != 1:
        return "stale"
    tests = [t for t in m.tests if (scratch / t).exists()]
    target.write_text(original.replace(m.old, m.new))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not serve", *tests],
            cwd=scratch,
            env={**_env(), "PYTHONPATH": str(scratch)},
            capture_output=True,
            timeout=timeout_s,
        )
        return "killed" if proc.returncode != 0 else "SURVIVED"
    except subprocess.TimeoutExpired:
        return "killed (timeout)"
    finally:
        target.write_text(original)


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("FAIRSHARE_")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ids", nargs="*", help="mutant ids to run (default: all)")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per mutant")
    args = p.parse_args(argv)
    known = {m.id: m for m in MUTANTS}
    unknown = [i for i in args.ids if i not in known]
    if unknown:
        p.error(f"unknown mutant id(s) {unknown}; known: {list(known)}")
    chosen = [known[i] for i in args.ids] if args.ids else MUTANTS
    if args.list:
        for m in chosen:
            print(f"{m.id:4} {m.path:28} {m.what}")
        return 0
    results: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        scratch = Path(tmp)
        _scratch_copy(scratch)
        for m in chosen:
            t0 = time.monotonic()
            results[m.id] = run_mutant(m, scratch, args.timeout_s)
            print(f"{m.id:4} {results[m.id]:17} {time.monotonic() - t0:5.1f} s  {m.path}: {m.what}", flush=True)
    applied = [r for r in results.values() if r != "stale"]
    killed = sum(r.startswith("killed") for r in applied)
    stale = len(results) - len(applied)
    print(
        f"kill rate: {killed}/{len(applied)} ({100 * killed / max(1, len(applied)):.0f}%)"
        + (f", {stale} stale" if stale else "")
    )
    return 0 if killed == len(applied) else 1


if __name__ == "__main__":
    sys.exit(main())
