"""The online pass-cost fit: recovers a known model through noise and outliers, stays monotone, safe and bounded."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.pass_cost import chunk_ctx_pairs
from scheduler.pass_cost_fit import PRIOR, FitSettings, LinearPassCost, OnlinePassCost, prior_from
from scheduler.sim.presets import PRESETS

# A GPU-like engine: 8 ms per pass, 40k prefill tok/s, attention, decode rows: what the fit must find.
TRUE = LinearPassCost(
    fixed_s=0.008, prefill_token_s=2.5e-5, prefill_pair_s=2e-9, decode_row_s=1e-4, decode_ctx_token_s=4e-8
)


def random_pass(rng: random.Random) -> tuple[int, float, int, int]:
    """A pass as engines run them: prefill chunks at some context, decode rows, or both (mixed)."""
    kind = rng.choice(["prefill", "decode", "mixed"])
    tokens = pairs = rows = ctx = 0
    if kind in ("prefill", "mixed"):
        tokens = rng.randrange(16, 8192)
        pairs = chunk_ctx_pairs(rng.randrange(0, 30_000), tokens)
    if kind in ("decode", "mixed"):
        rows = rng.randrange(1, 64)
        ctx = rows * rng.randrange(50, 20_000)  # the streams' mean context differs from pass to pass
    return tokens, pairs, rows, ctx


def feed(fit: OnlinePassCost, rng: random.Random, n: int, noise: float, outliers: float) -> None:
    for _ in range(n):
        figures = random_pass(rng)
        measured = TRUE.pass_s(*figures) * (1 + rng.gauss(0, noise))
        if rng.random() < outliers:
            measured *= rng.uniform(2, 6)  # preempted by the OS, a collection pause
        fit.observe(*figures, max(measured, 1e-6))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_the_fit_recovers_known_coefficients_through_noise_and_outliers(seed):
    rng = random.Random(seed)
    fit = OnlinePassCost()
    feed(fit, rng, 600, noise=0.03, outliers=0.05)
    fit.refit()
    for name, true in TRUE.to_dict().items():
        assert fit.model.to_dict()[name] == pytest.approx(true, rel=0.15), name
    # Out of sample: new passes predicted within a few percent by the fitted model (noise 3%), outliers aside
    # (`pass_s` also holds to the floor of the latest passes, which two outliers among them may raise).
    misses = []
    for _ in range(200):
        figures = random_pass(rng)
        misses.append(abs(fit.model.pass_s(*figures) / TRUE.pass_s(*figures) - 1))
    assert float(np.median(misses)) < 0.03


def test_its_error_is_the_median_miss_of_predictions_made_before_each_pass():
    fit = OnlinePassCost(settings=FitSettings(window_passes=256))
    assert fit.error() is None
    feed(fit, random.Random(1), 6, noise=0.0, outliers=0.0)
    assert fit.error() > 1.0  # the prior is far slower than this engine: its predictions are in the window
    feed(fit, random.Random(2), 512, noise=0.02, outliers=0.0)
    assert fit.error() < 0.03  # the prior's misses have left the window
    assert fit.describe()["model"] == "fitted" and fit.describe()["window_passes"] == 256


def test_it_states_the_overrun_quantile_of_its_fitted_predictions_of_passes_with_prefill():
    fit = OnlinePassCost(settings=FitSettings(error_min_passes=20, overrun_quantile=0.9))
    assert fit.relative_error == fit.settings.prior_error == 0.15  # nothing measured yet
    rng = random.Random(11)
    # Decode-only passes twice as slow as the engine at random: they move the window's error, not the stated one.
    for _ in range(40):
        rows = rng.randrange(1, 32)
        fit.observe(0, 0.0, rows, rows * 1000, TRUE.pass_s(0, 0.0, rows, rows * 1000) * rng.choice([0.5, 2.0]))
    assert fit.num_fits > 0 and fit.error() > 0.3 and fit.relative_error == 0.15
    # Prefill passes that run at 0.5x, or 10%, 20% ... 90% over what the fitted model predicts for them.
    overs = [-0.5] * 10 + [k / 10 for k in range(1, 10)] * 5
    rng.shuffle(overs)
    for i, over in enumerate(overs):
        figures = (rng.randrange(16, 8192), chunk_ctx_pairs(rng.randrange(0, 30_000), 1000), 0, 0)
        fit.observe(*figures, fit.pass_s(*figures) * (1 + over))
        if i < 19:
            assert fit.relative_error == 0.15  # too few passes to state its own
    # The 90th percentile of the 55 overruns (the 50th smallest): the underruns count as passes, never as error.
    assert fit.relative_error == pytest.approx(sorted(overs)[math.ceil(0.9 * len(overs)) - 1]) == pytest.approx(0.8)
    assert fit.describe()["relative_error"] == fit.relative_error


def test_the_stated_error_is_never_below_zero_and_follows_the_quantile():
    rng = random.Random(14)
    under, median, tail = (
        OnlinePassCost(settings=FitSettings(error_min_passes=8, overrun_quantile=q)) for q in (0.9, 0.5, 0.9)
    )
    for i in range(40):
        tokens = rng.randrange(16, 8192)
        figures = (tokens, chunk_ctx_pairs(rng.randrange(0, 30_000), tokens), 0, 0)
        under.observe(*figures, (TRUE.pass_s(*figures) if i < 8 else under.pass_s(*figures)) * 0.8)
        over = 0.05 if i % 4 else 0.6  # every fourth pass runs 60% over, the rest 5%
        for fit in (median, tail):
            fit.observe(*figures, (TRUE.pass_s(*figures) if i < 8 else fit.pass_s(*figures)) * (1 + over))
    assert under.relative_error == 0.0  # a model that only overestimates is charged nothing
    assert median.relative_error == pytest.approx(0.05) and tail.relative_error == pytest.approx(0.6)


def test_the_priors_predictions_are_not_in_the_stated_error():
    # Before the first fit every pass is predicted by the prior, hundreds of percent off, and never sized by it.
    fit = OnlinePassCost(settings=FitSettings(min_passes=8, error_min_passes=3))
    rng = random.Random(12)

    def prefill_pass() -> tuple[int, float, int, int]:
        tokens = rng.randrange(16, 8192)
        return tokens, chunk_ctx_pairs(rng.randrange(0, 30_000), tokens), 0, 0

    for _ in range(8):
        figures = prefill_pass()
        fit.observe(*figures, TRUE.pass_s(*figures))
    assert fit.num_fits == 1 and fit.error() > 1.0 and fit.relative_error == fit.settings.prior_error
    for _ in range(3):
        figures = prefill_pass()
        fit.observe(*figures, fit.pass_s(*figures) * 1.05)
    assert fit.error() > 1.0 and fit.relative_error == pytest.approx(0.05)


def test_the_stated_error_forgets_the_first_fits_misses_within_its_own_window():
    # The first fits miss by 50%, the settled ones by 10%. The stated error is (here) the median of the latest
    # `error_window_passes` prefill passes; with that window as long as the fit's (512) the early misses stay.
    recent, whole = (
        OnlinePassCost(settings=FitSettings(error_window_passes=n, overrun_quantile=0.5)) for n in (16, 512)
    )
    rng = random.Random(13)
    for i, over in enumerate([0.0] * 8 + [0.5] * 40 + [0.1] * 9):
        tokens = rng.randrange(16, 8192)
        figures = (tokens, chunk_ctx_pairs(rng.randrange(0, 30_000), tokens), 0, 0)
        for fit in (recent, whole):
            fit.observe(*figures, (TRUE.pass_s(*figures) if i < 8 else fit.pass_s(*figures)) * (1 + over))
        if i == 8 + 40 + 6:
            assert recent.relative_error == pytest.approx(0.5)  # 9 early misses of the latest 16, 7 settled
    assert recent.relative_error == pytest.approx(0.1)  # 9 settled of the latest 16
    assert whole.relative_error == pytest.approx(0.5)
    assert recent.num_window == 57 < recent.settings.window_passes


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    figures=st.tuples(st.integers(0, 100_000), st.floats(0, 1e10), st.integers(0, 512), st.integers(0, 10_000_000)),
    which=st.integers(0, 3),
    more=st.floats(0, 1e6),
)
def test_predictions_never_fall_when_a_pass_grows_in_any_figure(seed, figures, which, more):
    # Fitted to arbitrary data, even data that no linear model explains: coefficients stay non-negative.
    rng = random.Random(seed)
    fit = OnlinePassCost(settings=FitSettings(window_passes=64, refit_every_passes=16))
    for _ in range(64):
        fit.observe(*random_pass(rng), rng.uniform(1e-4, 5.0))
    assert fit.num_fits > 0
    grown = list(figures)
    grown[which] += int(more) if which != 1 else more
    if figures[0] == 0 and figures[2] == 0:
        assert fit.pass_s(*figures) == 0.0  # an empty pass costs nothing
    else:
        assert fit.pass_s(*grown) >= fit.pass_s(*figures)


def test_a_pass_beyond_twice_the_largest_measured_is_charged_for_how_far_beyond_it_reaches():
    # A new engine has run a document's first chunks: 512 tokens, at most 2,048 tokens deep.
    fit = OnlinePassCost(settings=FitSettings(min_passes=8))
    for i in range(8):
        figures = (512, chunk_ctx_pairs(256 * i, 512), 0, 0)
        fit.observe(*figures, TRUE.pass_s(*figures))
    largest = chunk_ctx_pairs(256 * 7, 512)
    assert (fit.measured_prefill_tokens, fit.measured_prefill_pairs) == (512, largest)
    within = (1024, 2 * largest, 0, 0)
    assert fit.pass_s(*within) == fit.model.pass_s(*within)  # twice the largest: as the fit says
    deep = (2048, chunk_ctx_pairs(3000, 2048), 0, 0)  # 4x the tokens, ~6x the pairs
    reach = deep[1] / (2 * largest)
    assert reach > 2048 / (2 * 512) and fit.pass_s(*deep) == pytest.approx(fit.model.pass_s(*deep) * reach)
    fit.observe(*deep, TRUE.pass_s(*deep))  # once run, it is within reach
    assert fit.pass_s(*deep) == fit.model.pass_s(*deep)
    assert fit.describe()["measured_prefill_tokens"] == 2048


def test_an_empty_window_predicts_nothing():
    # No prediction, so the planner sizes passes with its static knobs (a guessed prior would shrink them all).
    fit = OnlinePassCost()
    assert fit.model is PRIOR and fit.num_fits == 0
    assert fit.refit() is PRIOR  # nothing to fit
    assert math.isnan(fit.pass_s(512, chunk_ctx_pairs(0, 512), 4, 4000))
    assert fit.pass_s(0, 0.0, 0, 0) != 0.0  # not even an empty pass: the model is not there
    assert fit.describe()["model"] == "unfitted" and fit.describe()["median_abs_rel_error"] is None


def test_too_few_passes_predict_nothing_then_the_fit_does():
    fit = OnlinePassCost(settings=FitSettings(min_passes=8, refit_every_passes=1))
    feed(fit, random.Random(3), 7, noise=0.0, outliers=0.0)
    assert fit.model is PRIOR and math.isnan(fit.pass_s(512, 1000.0, 0, 0))
    feed(fit, random.Random(4), 1, noise=0.0, outliers=0.0)
    assert fit.model is not PRIOR and fit.pass_s(512, 1000.0, 0, 0) > 0


def test_a_new_engine_leaves_its_prior_after_min_passes_refits_every_pass_while_young_then_every_few_dozen():
    fit = OnlinePassCost(settings=FitSettings(min_passes=8, refit_every_passes=32))
    fits_at = []
    rng = random.Random(10)
    for n in range(1, 400):
        feed(fit, rng, 1, noise=0.0, outliers=0.0)
        if len(fits_at) < fit.num_fits:
            fits_at.append(n)
    gaps = [b - a for a, b in itertools.pairwise(fits_at)]
    assert fits_at[:8] == list(range(8, 16))  # every pass until the window holds 16
    assert gaps == sorted(gaps)  # then an eighth of the window so far
    assert gaps[-3:] == [32, 32, 32] and fits_at[-1] > 300


def test_the_prior_predicts_every_presets_passes_slower():
    rng = random.Random(5)
    for preset in PRESETS.values():
        for _ in range(200):
            figures = random_pass(rng)
            assert PRIOR.pass_s(*figures) >= preset.cost.pass_s(*figures), preset.name


def test_a_feature_the_window_never_exercised_keeps_its_prior_coefficient():
    # Decode-only traffic says nothing about prefill: the fit keeps the prior's (slow) prefill figures.
    rng = random.Random(6)
    fit = OnlinePassCost()
    for _ in range(256):
        rows = rng.randrange(1, 32)
        figures = (0, 0.0, rows, rows * rng.randrange(100, 4000))
        fit.observe(*figures, TRUE.pass_s(*figures))
    assert fit.model.prefill_token_s == pytest.approx(PRIOR.prefill_token_s, rel=0.01)
    assert fit.model.prefill_pair_s == pytest.approx(PRIOR.prefill_pair_s, rel=0.01)
    decode = (0, 0.0, 16, 16 * 2000)
    assert fit.pass_s(*decode) == pytest.approx(TRUE.pass_s(*decode), rel=0.02)


def test_memory_is_bounded_by_the_window():
    fit = OnlinePassCost(settings=FitSettings(window_passes=32, refit_every_passes=8))
    arrays = (fit._x, fit._y, fit._miss, fit._over.latest)
    feed(fit, random.Random(7), 1000, noise=0.01, outliers=0.0)
    assert fit.num_observed == 1000 and fit.num_window == 32
    assert all(a is b for a, b in zip(arrays, (fit._x, fit._y, fit._miss, fit._over.latest), strict=True))
    assert [len(a) for a in arrays] == [32 * 5, 32, 32, fit.settings.error_window_passes]


def test_the_same_passes_give_the_same_model():
    a, b = OnlinePassCost(), OnlinePassCost()
    feed(a, random.Random(8), 300, noise=0.05, outliers=0.05)
    feed(b, random.Random(8), 300, noise=0.05, outliers=0.05)
    assert a.model == b.model and a.num_fits == b.num_fits > 0


def test_a_frozen_fit_never_predicts_and_still_measures_its_prior():
    fit = OnlinePassCost(frozen_reason="tensor parallel: ranks time their passes apart")
    feed(fit, random.Random(9), 200, noise=0.0, outliers=0.0)
    assert fit.model is PRIOR and fit.num_fits == 0 and fit.error() > 1.0
    assert math.isnan(fit.pass_s(512, 1000.0, 0, 0))  # every rank: the static knobs, the same on each
    assert fit.describe()["frozen"].startswith("tensor parallel")


@pytest.mark.parametrize("measured", [0.0, -1.0, float("nan"), float("inf")])
def test_a_duration_that_is_not_a_positive_number_is_ignored(measured):
    fit = OnlinePassCost()
    assert fit.observe(512, 1000.0, 0, 0, measured) is None
    assert fit.observe(0, 0.0, 0, 0, 0.01) is None  # nothing ran
    assert fit.num_observed == 0


def test_bad_settings_and_coefficients_are_refused():
    with pytest.raises(ValueError, match="min_passes"):
        FitSettings(window_passes=4, min_passes=8)
    with pytest.raises(ValueError, match="trim_fraction"):
        FitSettings(trim_fraction=1.0)
    with pytest.raises(ValueError, match="prior_error"):
        FitSettings(prior_error=math.inf)
    with pytest.raises(ValueError, match="error_min_passes"):
        FitSettings(error_min_passes=0)
    with pytest.raises(ValueError, match="trust_factor"):
        FitSettings(trust_factor=0.5)
    with pytest.raises(ValueError, match="error_window_passes"):
        FitSettings(error_min_passes=9, error_window_passes=8)  # it could never state its own error
    with pytest.raises(ValueError, match="prefill_token_s"):
        LinearPassCost(0.01, -1e-5, 0.0, 0.0, 0.0)


def test_the_prior_is_the_linear_bound_of_a_cost_model():
    cost = PRESETS["h100-8b"].cost
    prior = prior_from(cost)
    assert prior.pass_s(4096, chunk_ctx_pairs(1000, 4096), 8, 8000) >= cost.pass_s(
        4096, chunk_ctx_pairs(1000, 4096), 8, 8000
    )


def test_no_pass_is_predicted_faster_than_two_smaller_ones_just_ran():
    # A young fit that believes attention is free, then chunks ever deeper into a document, each slower.
    fit = OnlinePassCost(settings=FitSettings(min_passes=4, floor_passes=8))
    for _ in range(4):
        fit.observe(64, chunk_ctx_pairs(0, 64), 0, 0, 0.01)
    chunk = 2048
    for depth, seconds in ((0, 0.15), (2048, 0.3), (4096, 0.45)):
        fit.observe(chunk, chunk_ctx_pairs(depth, chunk), 0, 0, seconds)
    deeper = (chunk, chunk_ctx_pairs(6144, chunk), 0, 0)
    assert fit.floor(*deeper) == pytest.approx(0.3)  # the second largest: two passes must agree
    assert fit.pass_s(*deeper) >= 0.3
    # Half a chunk, deeper than all three: at least half of what each cost; the second largest, half of 0.3 s.
    half = (chunk // 2, chunk_ctx_pairs(6144, chunk // 2), 0, 0)
    assert fit.floor(*half) == pytest.approx(0.15)
    # Nothing for an empty pass, and a smaller pass than any measured is bounded by none of the big ones alone.
    assert fit.floor(0, 0.0, 0, 0) == 0.0
    assert fit.floor(16, chunk_ctx_pairs(0, 16), 0, 0) <= 0.01


def test_one_outlier_does_not_set_the_floor_and_it_forgets_old_passes():
    fit = OnlinePassCost(settings=FitSettings(min_passes=4, floor_passes=8))
    figures = (1024, chunk_ctx_pairs(0, 1024), 0, 0)
    for _ in range(7):
        fit.observe(*figures, 0.1)
    fit.observe(*figures, 5.0)  # preempted
    assert fit.floor(*figures) == pytest.approx(0.1)
    fit.observe(*figures, 4.0)  # a second one agrees: the machine is that slow now
    assert fit.floor(*figures) == pytest.approx(4.0)
    for _ in range(8):
        fit.observe(*figures, 0.1)
    assert fit.floor(*figures) == pytest.approx(0.1)  # both left the latest 8


def test_decode_rows_a_pass_lacks_against_a_measured_one_are_taken_off_at_the_models_cost():
    fit = OnlinePassCost(settings=FitSettings(min_passes=2, floor_passes=8))
    for _ in range(3):
        fit.observe(512, chunk_ctx_pairs(0, 512), 32, 32_000, 0.2)
    m = fit.model
    lacking = 32 * m.decode_row_s + 32_000 * m.decode_ctx_token_s
    assert fit.floor(512, chunk_ctx_pairs(0, 512), 0, 0) == pytest.approx(max(0.0, 0.2 - lacking))
    assert fit.floor(512, chunk_ctx_pairs(0, 512), 32, 32_000) == pytest.approx(0.2)


def test_the_stated_error_is_recomputed_only_when_its_inputs_change_and_equals_a_fresh_fits(monkeypatch):
    quantile, computed = np.quantile, []

    def counting_quantile(*args, **kwargs):
        computed.append(kwargs.get("method") == "inverted_cdf")  # the stated error's quantile, not the fit's trim
        return quantile(*args, **kwargs)

    monkeypatch.setattr(np, "quantile", counting_quantile)
    passes = [random_pass(random.Random(12)) for _ in range(300)]
    passes = [(max(t, 16), p if t else chunk_ctx_pairs(0, 16), r, c) for t, p, r, c in passes]  # all with prefill
    passes = [(figures, TRUE.pass_s(*figures) * random.Random(n).uniform(0.8, 1.4)) for n, figures in enumerate(passes)]
    decode_only = [(0, 0.0, 1, 3000 + n) for n in range(100)]
    fit = OnlinePassCost()
    for figures, seconds in passes:
        fit.observe(*figures, seconds)
    stated = fit.relative_error
    assert stated > 0
    computed.clear()
    for figures in decode_only:  # a lone stream decoding: no pass with prefill joins the error's inputs
        fit.observe(*figures, TRUE.pass_s(*figures) * 1.3)
        assert fit.relative_error == stated
    assert sum(computed) == 0
    fresh = OnlinePassCost()
    for figures, seconds in passes:
        fresh.observe(*figures, seconds)
    for figures in decode_only:
        fresh.observe(*figures, TRUE.pass_s(*figures) * 1.3)
    assert fresh.relative_error == stated and fresh.model == fit.model
    figures, seconds = passes[0]
    fit.observe(*figures, seconds * 3)  # a pass with prefill that overran joins: the error is restated
    assert fit.relative_error > stated and sum(computed) == 2  # once for `fresh` above, once now
