"""The starvation ledger across passes: skip counts, reservations, and pruning requests that left the queue."""

from factories import cfg
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.admission import StarvationLedger


def test_prune_over_the_bound_drops_exactly_the_requests_that_left_and_keeps_the_counts() -> None:
    ledger = StarvationLedger(max_entries=3)
    for rid, skips in (("a", 1), ("b", 2), ("gone1", 3), ("gone2", 1)):
        for _ in range(skips):
            ledger.record_skip(rid)
    ledger.prune({"a", "b", "not-skipped-yet"})
    assert ledger.skipped_passes == {"a": 1, "b": 2}


def test_prune_within_the_bound_leaves_the_ledger_alone() -> None:
    # Pruning walks the whole ledger: below the bound it is not worth it (a left request costs one entry).
    ledger = StarvationLedger(max_entries=3)
    ledger.record_skip("gone")
    ledger.prune(set())
    assert ledger.skipped_passes == {"gone": 1}


def test_a_pruned_request_starts_again_from_zero_skips() -> None:
    ledger = StarvationLedger(max_entries=0)
    c = cfg(max_skipped_passes=2)
    ledger.record_skip("r")
    ledger.record_skip("r")
    assert ledger.is_reserved("r", c)
    ledger.prune(set())
    assert not ledger.is_reserved("r", c)


@settings(deadline=None)  # CI shares 2 cores: time is no part of these properties
@given(
    skips=st.dictionaries(st.text(min_size=1, max_size=3), st.integers(1, 5), max_size=20),
    alive=st.sets(st.text(min_size=1, max_size=3), max_size=20),
    max_entries=st.integers(0, 10),
)
def test_prune_invariants(skips: dict[str, int], alive: set[str], max_entries: int) -> None:
    ledger = StarvationLedger(max_entries=max_entries)
    for rid, n in skips.items():
        for _ in range(n):
            ledger.record_skip(rid)
    ledger.prune(alive)
    # Nothing alive loses its count; over the bound nothing dead stays.
    assert {r: n for r, n in skips.items() if r in alive} == {
        r: n for r, n in ledger.skipped_passes.items() if r in alive
    }
    if len(skips) > max_entries:
        assert set(ledger.skipped_passes) <= alive
    else:
        assert ledger.skipped_passes == skips
