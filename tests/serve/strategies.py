"""Hypothesis strategies the routing and placement properties share."""

from __future__ import annotations

from hypothesis import strategies as st

from serve_app.routing.backpressure import BackpressureLimits

limits_st = st.one_of(
    st.none(),
    st.builds(
        BackpressureLimits,
        max_ongoing_requests=st.integers(1, 10),
        max_queued_requests=st.integers(1, 6),
        max_queued_prefill_tokens=st.integers(1000, 200_000),
    ),
)
"""A replica's published backpressure limits, or none published yet."""
