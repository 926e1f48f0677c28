"""The starvation ledger across passes: first skip, reservations, and pruning requests that left the queue."""

from hypothesis import example, given, settings
from hypothesis import strategies as st

from scheduler.admission import StarvationLedger
from scheduler.snapshot import Rejection
from tests.factories import cfg
from tests.hypothesis_budget import examples


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


def _rejection(rid: str, skipped: bool) -> Rejection:
    return Rejection(rid, 100, 10, 10, num_cut=0, max_cut=1, num_can_run=0, skipped=skipped)


def test_record_skips_records_only_skipped_rejections() -> None:
    ledger = StarvationLedger()
    ledger.record_skips([_rejection("a", True), _rejection("b", False)], 3)
    assert ledger.first_skipped == {"a": 3}


_RIDS = "abc"
_lists = st.lists(st.tuples(st.sampled_from(_RIDS), st.booleans()), max_size=4)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.integers(0, 1), st.integers(0, 30)),
        st.tuples(st.just("forget"), st.sampled_from(_RIDS), st.just(0)),
        st.tuples(st.just("prune"), st.sets(st.sampled_from(_RIDS)), st.just(0)),
    ),
    max_size=40,
)


@settings(deadline=None, max_examples=examples(300))
@given(lists=st.lists(_lists, min_size=2, max_size=2), ops=_ops, max_entries=st.integers(0, 3))
@example(lists=[[("a", True)], []], ops=[("record", 0, 1), ("forget", "a", 0), ("record", 0, 5)], max_entries=3)
@example(lists=[[("a", True)], []], ops=[("record", 0, 1), ("prune", set(), 0), ("record", 0, 5)], max_entries=0)
def test_record_skips_of_a_list_seen_before_is_the_same_as_recording_it_again(lists, ops, max_entries) -> None:
    # Engines replay an idle pass's rejection list every iteration; the ledger skips the walk when it recorded
    # that very list last and dropped nothing since. The twin records every rejection every time.
    rejection_lists = [[_rejection(rid, skipped) for rid, skipped in spec] for spec in lists]
    fast, twin = StarvationLedger(max_entries=max_entries), StarvationLedger(max_entries=max_entries)
    for op, arg, pass_index in ops:
        if op == "record":
            fast.record_skips(rejection_lists[arg], pass_index)
            for r in rejection_lists[arg]:
                if r.skipped:
                    twin.record_skip(r.rid, pass_index)
        elif op == "forget":
            fast.forget(arg)
            twin.forget(arg)
        else:
            fast.prune(arg)
            twin.prune(arg)
        assert fast.first_skipped == twin.first_skipped
