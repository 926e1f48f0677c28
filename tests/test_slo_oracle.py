"""The SLO oracle's bookkeeping: outcomes pooled over seeds, and an oracle that must keep the SLO on every seed."""

from __future__ import annotations

from benchmarks import slo_oracle as bench


def outcome(spec: str, seeds: list[int], met: int, docs: float, short: int = 100, ttft: float = 0.4) -> bench.Outcome:
    return bench.Outcome(
        spec=spec, seeds=seeds, ttft_p99_s=ttft, tbt_p99_s=0.2, num_short=short, num_met=met, docs_tok_per_s=docs
    )


def test_outcomes_pool_their_counts_worst_tails_and_mean_throughput():
    a, b = outcome("x", [0], 100, 900.0, ttft=0.3), outcome("x", [1, 2], 190, 1200.0, short=200, ttft=0.45)
    pooled = a.pooled(b)
    assert pooled.seeds == [0, 1, 2] and (pooled.num_short, pooled.num_met) == (300, 290)
    assert pooled.ttft_p99_s == 0.45 and pooled.docs_tok_per_s == (900.0 + 2 * 1200.0) / 3
    assert not pooled.keeps_slo and a.keeps_slo


def test_a_first_seed_that_spent_the_whole_runs_allowance_gives_up():
    assert outcome("x", [0], 97, 1.0).could_keep(3)  # 3 misses: within 1% of 300
    assert not outcome("x", [0], 96, 1.0).could_keep(3)


class Canned(bench.RowRunner):
    """Outcomes by (spec, first seed asked): no simulation."""

    def __init__(self, table: dict[tuple[str, int], tuple[int, float]]) -> None:
        self.table, self.seeds, self.asked = table, [0, 1, 2], []

    def outcome(self, spec: str, seeds: list[int]) -> bench.Outcome:
        self.asked.append((spec, tuple(seeds)))
        met, docs = self.table[(spec, seeds[0])]
        return outcome(spec, seeds, met * len(seeds), docs, short=100 * len(seeds))


def test_the_oracle_is_the_best_first_seed_setting_that_keeps_the_slo_on_every_seed():
    runner = Canned(
        {
            ("lucky", 0): (100, 3000.0),  # best on the first seed, misses on the others
            ("lucky", 1): (90, 3000.0),
            ("steady", 0): (100, 2000.0),
            ("steady", 1): (100, 2100.0),
            ("hopeless", 0): (50, 5000.0),  # never tried on the other seeds
        }
    )
    best = runner.oracle(["hopeless", "steady", "lucky"])
    assert best is not None and best.spec == "steady" and best.seeds == [0, 1, 2]
    assert best.docs_tok_per_s == (2000.0 + 2 * 2100.0) / 3
    assert ("hopeless", (1, 2)) not in runner.asked and runner.asked[-2:] == [("lucky", (1, 2)), ("steady", (1, 2))]


def test_no_oracle_when_no_setting_keeps_the_slo_on_every_seed():
    runner = Canned({("a", 0): (100, 1.0), ("a", 1): (95, 1.0)})
    assert runner.oracle(["a"]) is None
