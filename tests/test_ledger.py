"""The starvation ledger across passes: first skip, reservations, and pruning requests that left the queue."""

from factories import cfg
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.admission import StarvationLedger


def test_a_skip_is_recorded_once_at_its_first_pass() -> None:
    ledger = StarvationLedger()
    ledger.record_skip("r", 5)
    ledger.record_skip("r", 5)  # the planner may scan a pass twice
    ledger.record_skip("r", 9)
    assert ledger.first_skipped == {"r": 5}


def test_reserved_after_max_skipped_passes_counted_in_forward_passes() -> None:
    ledger = StarvationLedger()
    c = cfg(max_skipped_passes=3)
    ledger.record_skip("r", 10)
    assert [ledger.is_reserved("r", c, p) for p in (10, 12, 13, 20)] == [False, False, True, True]
    assert not ledger.is_reserved("never-skipped", c, 1000)


def test_prune_over_the_bound_drops_exactly_the_requests_that_left_and_keeps_the_rest() -> None:
    ledger = StarvationLedger(max_entries=3)
    for rid, first in (("a", 1), ("b", 2), ("gone1", 3), ("gone2", 1)):
        ledger.record_skip(rid, first)
    ledger.prune({"a", "b", "not-skipped-yet"})
    assert ledger.first_skipped == {"a": 1, "b": 2}


def test_prune_within_the_bound_leaves_the_ledger_alone() -> None:
    # Pruning walks the whole ledger: below the bound it is not worth it (a left request costs one entry).
    ledger = StarvationLedger(max_entries=3)
    ledger.record_skip("gone", 1)
    ledger.prune(set())
    assert ledger.first_skipped == {"gone": 1}


def test_a_pruned_request_starts_again_unreserved() -> None:
    ledger = StarvationLedger(max_entries=0)
    c = cfg(max_skipped_passes=2)
    ledger.record_skip("r", 0)
    assert ledger.is_reserved("r", c, 2)
    ledger.prune(set())
    assert not ledger.is_reserved("r", c, 2)
    ledger.record_skip("r", 2)
    assert not ledger.is_reserved("r", c, 3) and ledger.is_reserved("r", c, 4)


@settings(deadline=None)  # CI shares 2 cores: time is no part of these properties
@given(
    skips=st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 50), max_size=20),
    alive=st.sets(st.text(min_size=1, max_size=3), max_size=20),
    max_entries=st.integers(0, 10),
)
def test_prune_invariants(skips: dict[str, int], alive: set[str], max_entries: int) -> None:
    ledger = StarvationLedger(max_entries=max_entries)
    for rid, first in skips.items():
        ledger.record_skip(rid, first)
    ledger.prune(alive)
    # Nothing alive loses its first skip; over the bound nothing dead stays.
    assert {r: n for r, n in skips.items() if r in alive} == {
        r: n for r, n in ledger.first_skipped.items() if r in alive
    }
    if len(skips) > max_entries:
        assert set(ledger.first_skipped) <= alive
    else:
        assert ledger.first_skipped == skips
