"""Decode interleave: which pass kind runs next, and decode-only passes only when someone decodes."""

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.interleave import DecodeInterleave, PassKind, short_decode_passes
from tests.factories import cfg


def test_prefill_pass_is_mixed_only_with_decoders() -> None:
    d = DecodeInterleave()
    assert d.next_kind(cfg(mixed_decode=True), has_prefill=True, num_decoding=3, num_short_decoding=0) is PassKind.MIXED
    assert d.next_kind(cfg(mixed_decode=True), has_prefill=True, num_decoding=0, num_short_decoding=0) is (
        PassKind.PREFILL
    )
    assert d.next_kind(cfg(mixed_decode=False), has_prefill=True, num_decoding=3, num_short_decoding=0) is (
        PassKind.PREFILL
    )


def test_without_prefill_the_pass_decodes_or_idles() -> None:
    d = DecodeInterleave()
    assert d.next_kind(cfg(), has_prefill=False, num_decoding=2, num_short_decoding=2) is PassKind.DECODE
    assert d.next_kind(cfg(), has_prefill=False, num_decoding=0, num_short_decoding=0) is PassKind.IDLE


def test_decode_passes_owed_after_a_prefill_run_only_while_someone_decodes() -> None:
    c = cfg(decode_steps_per_prefill=2)
    d = DecodeInterleave()
    d.next_kind(c, has_prefill=True, num_decoding=1, num_short_decoding=0)
    assert [d.decode_due(1), d.decode_due(1), d.decode_due(1)] == [True, True, False]
    d.next_kind(c, has_prefill=True, num_decoding=0, num_short_decoding=0)
    # Nobody decodes: no decode-only pass (it would run with no rows), the prefill goes on.
    assert d.decode_due(0) is False


def test_short_streams_get_a_decode_pass_after_each_prefill_pass_only_with_mixed_chunk_off() -> None:
    off, on = cfg(mixed_decode=False), cfg(mixed_decode=True)
    assert short_decode_passes(off, num_short_decoding=1) == 1
    assert short_decode_passes(off, num_short_decoding=0) == 0  # only documents decode: prefill goes on
    assert short_decode_passes(on, num_short_decoding=3) == 0  # they ride along in the prefill pass
    d = DecodeInterleave()
    d.next_kind(off, has_prefill=True, num_decoding=2, num_short_decoding=1)
    assert [d.decode_due(2), d.decode_due(2)] == [True, False]


@settings(deadline=None)  # CI shares 2 cores: time is no part of these properties
@given(
    steps=st.integers(0, 4),
    mixed=st.booleans(),
    passes=st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.integers(0, 3)), max_size=40),
)
def test_decode_only_passes_never_run_empty_and_never_exceed_the_interval(steps, mixed, passes) -> None:
    c = cfg(decode_steps_per_prefill=steps, mixed_decode=mixed)
    d = DecodeInterleave()
    decode_run = 0
    for has_prefill, num_decoding, extra in passes:
        num_short = min(num_decoding, extra)
        if d.decode_due(num_decoding):
            assert num_decoding > 0
            decode_run += 1
            assert decode_run <= max(steps, 1)
            continue
        decode_run = 0
        kind = d.next_kind(c, has_prefill, num_decoding, num_short)
        if kind in (PassKind.DECODE, PassKind.MIXED):
            assert num_decoding > 0
        if kind is PassKind.IDLE:
            assert not has_prefill and num_decoding == 0
