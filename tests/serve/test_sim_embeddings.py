"""The sim embeddings model: deterministic unit vectors, `dimensions` as OpenAI's shortening (property tests)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.embeddings.sim_vectors import sim_token_count, sim_vector

inputs = st.one_of(st.text(min_size=1, max_size=200), st.lists(st.integers(0, 100_000), min_size=1, max_size=50))


@settings(max_examples=200, deadline=None)
@given(item=inputs, dims=st.integers(1, 512), data=st.data())
def test_vectors_are_unit_deterministic_and_shorten_to_a_prefix(item, dims: int, data) -> None:
    v = sim_vector(item, dims)
    assert v.shape == (dims,) and v.dtype == np.float32
    assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-5
    assert np.array_equal(v, sim_vector(item, dims))  # a function of the input alone
    k = data.draw(st.integers(1, dims))
    short = sim_vector(item, dims, k)
    assert abs(float(np.linalg.norm(short)) - 1.0) < 1e-5
    # OpenAI's shortening: the first k components of the full vector, normalised again
    assert np.allclose(short, v[:k] / np.linalg.norm(v[:k]), atol=1e-6)


def test_different_inputs_get_different_vectors() -> None:
    texts = [f"text {i}" for i in range(200)]
    vectors = np.stack([sim_vector(t, 64) for t in texts])
    cos = vectors @ vectors.T
    np.fill_diagonal(cos, 0)
    assert float(np.max(np.abs(cos))) < 0.9
    assert not np.array_equal(sim_vector("a", 8), sim_vector([97], 8))  # text and token ids are different inputs


def test_token_counts() -> None:
    assert sim_token_count("abcdefgh", 4.0) == 2 and sim_token_count("a", 4.0) == 1
    assert sim_token_count([1, 2, 3], 4.0) == 3
