"""The simulator reproduces the source articles' figures from their stated rules."""

import pytest

from scheduler.sim.reproduce import reproduce

# Figures that cannot follow from the article's own rules (explained in docs/simulator.md):
KNOWN_DEVIATIONS = {
    # 1.80 s is more than two whole F=1024 passes (0.84 s each by the sweep's own throughput), yet the
    # question waits for at most the rest of one pass plus its own.
    ("patch F=1024", "short TTFT s"),
    # Four documents sharing a pass of 4 x 409 tokens run at ~97% of the sweep's top speed by the same
    # sweep; the patch's 1,200 tok/s implies overheads of concurrent chunked requests the article does not state.
    ("patch after, 4 parallel", "long prefill tok/s"),
}


@pytest.fixture(scope="module")
def rows():
    return reproduce()


def test_every_stated_figure_is_within_tolerance_except_the_explained_ones(rows):
    failing = {(r.case, r.metric) for r in rows if r.ok is False}
    assert failing == KNOWN_DEVIATIONS


def test_row_set_covers_the_seed_tables(rows):
    cases = {r.case for r in rows}
    for f in (4096, 2048, 1024, 512, 409):
        assert f"patch F={f}" in cases
    assert sum(r.case.startswith("patch before") for r in rows) == 4
    assert sum(r.case.startswith("patch after") for r in rows) == 4
    assert sum(r.case.startswith("chunk-steps") for r in rows) == 21


def test_step_table_stated_cells_are_exact(rows):
    stated = [r for r in rows if r.case.startswith("chunk-steps") and r.article is not None]
    assert len(stated) == 13 and all(r.sim == r.article for r in stated)
