"""Hypothesis strategies the routing and placement properties share."""

from __future__ import annotations

from hypothesis import strategies as st

from serve_app.replica.backend import ReplicaLoad
from serve_app.routing.backpressure import BackpressureLimits

limits_st = st.one_of(
    st.none(),
    st.builds(
        BackpressureLimits,
        max_queued_requests=st.integers(1, 6),
        max_queued_prefill_tokens=st.integers(1000, 200_000),
    ),
)
"""A replica's published backpressure limits, or none published yet."""

loads_st = st.builds(
    ReplicaLoad,
    num_waiting=st.integers(0, 8),
    num_decoding=st.integers(0, 8),
    prefill_tokens=st.integers(0, 200_000),
    prefill_tok_per_s=st.floats(100, 100_000),
    pass_fixed_s=st.floats(0, 0.1),
    pass_tokens=st.integers(0, 16_384),
    short_first=st.booleans(),
)
"""A replica's published load, with a prefill rate (so TTFTs are predicted)."""
