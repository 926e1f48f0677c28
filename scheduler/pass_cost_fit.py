"""The pass-cost model fitted online from an engine's own measured passes: a `PassCost` that needs no preset.

The model is linear in the four figures of `PassCost.pass_s`, with non-negative coefficients, so a prediction
never falls when a pass grows in any of them:

    pass_s = fixed_s + prefill_token_s * prefill_tokens + prefill_pair_s * prefill_ctx_pairs
           + decode_row_s * decode_rows + decode_ctx_token_s * decode_ctx_tokens        (0 for an empty pass)

The simulator's cost model combines the fixed cost with the rest by a p-norm (p >= 1); a sum is its upper bound,
so the linear form errs on the slow side where the fixed cost overlaps with compute.

The fit, over a sliding window of the last `FitSettings.window_passes` measured passes:

- non-negative least squares on *relative* error (each pass weighted by 1 / its duration), so a 5 ms decode pass
  counts as much as a 2 s prefill pass and the median relative error is what the fit minimises in effect;
- coefficients measured in units of the prior's and pulled towards it by a fraction of a pass
  (`prior_weight_passes`) in each figure: a coefficient the window does not exercise (no long context yet, no
  decode rows) stays at the prior, the split between figures that always move together leans to the prior's,
  and everything else is set by the data (hundreds of passes against a tenth of one);
- then fitted again without the `trim_fraction` passes it fits worst: a pass the OS preempted, a first pass
  after idle, a garbage-collection pause;
- after `min_passes` measured passes, then at intervals of an eighth of the window so far, up to
  `refit_every_passes`: every pass while the window is young, and between refits of a settled fit a pass costs
  a prediction and a row written into fixed arrays (the scheduler loop times every pass).

The prior is the slowest engine this project has figures for (the article's 12 GB card with a 27B model, preset
``card12gb-27b``), summed instead of p-norm-combined: it predicts passes slower than nearly any engine runs them,
so where the window has not exercised a figure the fit errs slow and a controller sizing passes from it chooses
small ones. Until the first fit `pass_s` predicts nothing (NaN, which the planner reads as "no usable model" and
sizes passes with its static knobs): before any measurement a guessed prior would make the controller shrink
every pass to its floor (with the article's card as prior, a document gets a token a pass), and the static knobs
are the policy's own safe default. The prior's predictions are still scored, so the error shows how far off it is.

Its error is that of every model here: each measured pass is first predicted by the model in force (the prior
before the first fit), before it joins the window, and the median absolute relative error of those predictions
over the window is reported (out of sample, the prior's misses included until they leave the window).

The error it *states* (`relative_error`, which the SLO sizer charges each predicted pass with: a pass may run ``1 +
error`` times its prediction) is its tail overrun: the `FitSettings.overrun_quantile` quantile of ``measured /
predicted - 1`` over the latest `FitSettings.error_window_passes` passes that carry prefill and were predicted by a
fit (0 if that quantile is an underrun). A quantile, not the median miss, because a chat's first token waits for a
whole pass and the TTFT target is a p99: charged with the median, passes are sized so that half of them overrun
their bound, and a chat that arrives during one waits past the target (`benchmarks.fit_replay` on the CPU engine's
traces: measured over predicted has a p90 of about 1.65 where the median miss is 10-15%).
`PolicyConfig.pass_overrun_quantile` sets it: lower trades the chats' tail for bigger passes. Signed, because only
overruns break a bound: a document's first chunk that ran at a third of its prediction must not widen the margin.
The latest, because the first fits (on a dozen passes, their coefficients still moving) miss by far more than a
settled fit, and over a 512-pass window, which a run of minutes on the CPU engine never fills, their misses would
set the margin long after the fit has settled. Prefill passes, because they are the passes the sizer sizes against
its bounds; the decode-only passes (most of a window, a few milliseconds each, noisy in relative terms) would set
the margin by what it is never charged on. Fitted predictions, because the prior's are never used to size a pass
(nothing is predicted before the first fit) and miss by hundreds of percent. Relative to the prediction, as the
sizer charges it. Until it has `FitSettings.error_min_passes` such passes the fit states `FitSettings.prior_error`.

It never extrapolates far: a pass more than `FitSettings.trust_factor` times the largest the engine has measured,
in prefill tokens or in attended pairs, is predicted as much slower than the fit says as it is beyond that
(`extrapolation`). A fit on a new engine's first dozen passes (a chat, a document's first chunks) has seen no deep
chunk; asked about a 2,048-token chunk 3,000 tokens into a document it predicted 0.06-0.1 s and the pass took
0.4-0.55 s, so the chats that arrived meanwhile waited a second (measured on the CPU engine). The charge lets passes
grow by that factor per measured pass instead, and the refits catch up.

Nor does it predict a pass faster than the engine has just run smaller ones (`floor`). For any cost linear and
non-negative in the figures, a pass with at least ``l`` times a measured pass's prefill tokens and attended pairs
(``l <= 1``) costs at least ``l`` times what that pass measured, less the fitted cost of the decode rows it lacks
against it. The floor is the second largest such bound over the latest `FitSettings.floor_passes` measured passes:
two passes must agree, so one the OS preempted does not set it. A fit on a new engine's first dozen passes gets
the attention slope wrong inside its reach too: held for 8 passes, it predicted chunks deep in a document at
0.06-0.07 s that took 0.4-0.58 s, each deeper than the ones before it. With a refit every pass while the window is
young (`refit_interval`) and the floor, the same chunks are predicted 1.4-2.2 times too fast (`benchmarks.fit_replay`
replays an engine's pass trace through the fit as built and as it was). The latest passes only, because the
machine's noise would make an old outlier pair a floor for every pass that dominates them; 8, so the chunks just
run are among them.

Deterministic given its inputs: the same measured passes in the same order give the same coefficients. Across
tensor-parallel ranks the inputs differ (each rank times its own passes), so `OnlinePassCost` can be frozen
(`frozen_reason`): it still measures its error, never fits, and so never predicts: every rank sizes passes with the
static knobs, the same on each.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from scipy.optimize import nnls

from scheduler.config import PolicyConfig
from scheduler.pass_cost import AttentionWork, Overruns
from scheduler.sim.presets import CARD12GB

NUM_FEATURES = 5
"""The intercept (fixed cost) and the four figures of `PassCost.pass_s`."""
ABSENT_FIGURE = 1e-12
"""Mean square share of the passes' time below which a figure counts as absent from the window."""


@dataclass(frozen=True, slots=True)
class LinearPassCost:
    """A `PassCost` linear in its figures; what the online fit produces and its prior."""

    fixed_s: float
    prefill_token_s: float
    prefill_pair_s: float
    decode_row_s: float
    decode_ctx_token_s: float

    def __post_init__(self) -> None:
        bad = {f.name: getattr(self, f.name) for f in fields(self) if not getattr(self, f.name) >= 0}
        if bad:
            raise ValueError(f"pass-cost coefficients must be finite and >= 0: {bad}")

    def pass_s(self, prefill_tokens: int, prefill_ctx_pairs: float, decode_rows: int, decode_ctx_tokens: int) -> float:
        if prefill_tokens == 0 and decode_rows == 0:
            return 0.0
        return (
            self.fixed_s
            + self.prefill_token_s * prefill_tokens
            + self.prefill_pair_s * prefill_ctx_pairs
            + self.decode_row_s * decode_rows
            + self.decode_ctx_token_s * decode_ctx_tokens
        )

    def coefficients(self) -> tuple[float, float, float, float, float]:
        """In feature order: intercept, prefill tokens, prefill pairs, decode rows, decode context tokens."""
        return (self.fixed_s, self.prefill_token_s, self.prefill_pair_s, self.decode_row_s, self.decode_ctx_token_s)

    @classmethod
    def from_coefficients(cls, values: Any) -> LinearPassCost:
        return cls(*(float(v) for v in values))

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def prior_from(cost: Any) -> LinearPassCost:
    """The linear upper bound of a simulator `CostModel` (fixed cost and compute summed, p = 1)."""
    return LinearPassCost(
        fixed_s=cost.fixed_s,
        prefill_token_s=1.0 / cost.prefill_tok_per_s,
        prefill_pair_s=cost.attn_s_per_token_ctx,
        decode_row_s=cost.decode_row_s,
        decode_ctx_token_s=cost.attn_s_per_token_ctx,
    )


PRIOR = prior_from(CARD12GB.cost)
"""The slowest engine with figures here (see the module docstring): safe until the fit has data."""


@dataclass(frozen=True, slots=True)
class FitSettings:
    window_passes: int = 512
    """Measured passes the fit keeps (a ring: memory is fixed)."""
    refit_every_passes: int = 64
    """Measured passes between refits."""
    min_passes: int = 8
    """No fit on fewer passes than this: no prediction until then."""
    prior_weight_passes: float = 0.1
    """The prior's weight per coefficient, in passes of the window's own size in that figure: it decides only what
    the window cannot (a figure no pass exercised, the split between figures that always move together)."""
    trim_fraction: float = 0.1
    """Share of the window's worst-fitting passes left out of the second fit."""
    error_min_passes: int = 8
    """Fitted predictions of passes with prefill needed before the fit states their error."""
    error_window_passes: int = 64
    """The latest fitted predictions of passes with prefill whose overrun the fit states."""
    overrun_quantile: float = PolicyConfig.model_fields["pass_overrun_quantile"].default
    """The quantile of their overruns (``measured / predicted - 1``) the fit states as its error."""
    trust_factor: float = 2.0
    """How far beyond the largest pass measured (prefill tokens, attended pairs) the fit's prediction is taken as it
    is; beyond, it is charged in proportion."""
    floor_passes: int = 8
    """The latest measured passes whose times bound the prediction of a pass that dominates them (`floor`; 0 or 1:
    no floor)."""
    prior_error: float = 0.15
    """The error the fit states before it has measured its own: the median error issue 21 holds the fit to, and
    about what it measured on the CPU engine (15-22% over passes with prefill)."""

    def __post_init__(self) -> None:
        if self.window_passes < self.min_passes or self.min_passes < 1 or self.refit_every_passes < 1:
            raise ValueError(f"need 1 <= min_passes <= window_passes and refit_every_passes >= 1: {self}")
        if not self.trust_factor >= 1:
            raise ValueError(f"need trust_factor >= 1: {self}")
        if self.floor_passes < 0:
            raise ValueError(f"need floor_passes >= 0: {self}")
        if not (self.prior_weight_passes > 0 and 0 <= self.trim_fraction < 1):
            raise ValueError(f"need prior_weight_passes > 0 and 0 <= trim_fraction < 1: {self}")
        if not (1 <= self.error_min_passes <= self.error_window_passes and 0 <= self.prior_error < math.inf):
            raise ValueError(f"need 1 <= error_min_passes <= error_window_passes and a finite prior_error >= 0: {self}")
        if not 0 <= self.overrun_quantile <= 1:
            raise ValueError(f"need 0 <= overrun_quantile <= 1: {self}")


def fit_coefficients(x: np.ndarray, y: np.ndarray, prior: LinearPassCost, settings: FitSettings) -> LinearPassCost:
    """The fit described in the module docstring, on passes `x` (rows of `NUM_FEATURES` figures, intercept first)
    measured as `y` seconds."""
    scale = np.asarray(prior.coefficients())
    rows = x * scale / y[:, None]  # a pass's relative residual, coefficients in units of the prior's
    units = _nnls_towards_one(rows, settings.prior_weight_passes)
    if settings.trim_fraction > 0:
        miss = np.abs(rows @ units - 1.0)
        keep = miss <= np.quantile(miss, 1.0 - settings.trim_fraction)
        units = _nnls_towards_one(rows[keep], settings.prior_weight_passes)
    return LinearPassCost.from_coefficients(units * scale)


def _nnls_towards_one(rows: np.ndarray, prior_passes: float) -> np.ndarray:
    """argmin over u >= 0 of |rows @ u - 1|^2 + sum_j w_j (u_j - 1)^2, where w_j is `prior_passes` passes of the
    rows' own mean square in column j: the pull has the same small weight against the data in every column,
    whatever the prior's scale, and decides alone only in a column the rows leave at zero.

    Solved on its normal equations (five unknowns: a 5 x 5 problem however long the window), columns scaled to
    unit mean square (v = u * scale), by non-negative least squares on the Cholesky factor of the Gram matrix."""
    scale = np.sqrt(np.maximum(np.mean(rows * rows, axis=0), ABSENT_FIGURE))
    scaled = rows / scale
    gram = scaled.T @ scaled + prior_passes * np.eye(NUM_FEATURES)
    rhs = scaled.sum(axis=0) + prior_passes * scale
    upper = np.linalg.cholesky(gram).T  # gram = upper.T @ upper
    units, _ = nnls(upper, np.linalg.solve(upper.T, rhs))
    return np.asarray(units / scale)  # scipy ships no types


class OnlinePassCost:
    """`PassCost` from the engine's measured passes (see the module docstring). Feed it every measured pass with
    `observe`; ask it like any `PassCost`."""

    def __init__(
        self,
        prior: LinearPassCost = PRIOR,
        settings: FitSettings | None = None,
        frozen_reason: str | None = None,
        attention: AttentionWork = AttentionWork.QUERIES,
    ) -> None:
        self.prior = prior
        self.attention = attention
        """How the engine's attention kernel works (`scheduler.pass_cost.AttentionWork`): the figures the fit learns
        from are counted so, and so are the passes the planner asks it about."""
        self.settings = settings or FitSettings()
        self.frozen_reason = frozen_reason
        """Why the fit never fits (and so never predicts), or None."""
        self.model = prior
        """The model the window's predictions are scored with: the prior until the first fit."""
        self.num_observed = 0
        """Passes measured since start (the window holds the last `window_passes` of them)."""
        self.num_fits = 0
        self._since_fit = 0
        # The window is a ring in flat `array` buffers, which numpy reads without a copy when it fits: every pass
        # writes a row, and numpy's conversion of a tuple into a row of its own array costs the scheduler loop more
        # than five plain stores (measured in the server: the most expensive line of a decode-only pass).
        size = self.settings.window_passes
        self._x = array("d", bytes(8 * NUM_FEATURES * size))
        self._y = array("d", bytes(8 * size))
        self._miss = array("d", bytes(8 * size))
        s = self.settings
        self._over = Overruns(s.error_window_passes, s.error_min_passes, s.overrun_quantile, s.prior_error)
        """How the latest passes with prefill that a fit predicted ran against their predictions."""
        self.measured_prefill_tokens = 0
        """The most prefill tokens of any pass measured since start."""
        self.measured_prefill_pairs = 0.0
        """The most attended pairs of any pass measured since start."""
        self._latest: deque[tuple[int, float, int, int, float]] = deque(maxlen=self.settings.floor_passes)
        """(prefill tokens, pairs, decode rows, their contexts, seconds) of the latest measured passes (`floor`)."""
        self.loop_overhead_s = 0.0
        """The scheduler's own seconds between back-to-back passes, which its timed passes leave out
        (`scheduler.pass_cost.loop_overhead_of`); its timer measures them (`sglang_plugin.pass_timer.LoopGaps`)."""

    def pass_s(self, prefill_tokens: int, prefill_ctx_pairs: float, decode_rows: int, decode_ctx_tokens: int) -> float:
        """The fitted model's seconds, charged for `extrapolation`, and at least the `floor`; NaN (no prediction)
        until the first fit."""
        if not self.num_fits:
            return math.nan
        seconds = self.model.pass_s(prefill_tokens, prefill_ctx_pairs, decode_rows, decode_ctx_tokens)
        seconds *= self.extrapolation(prefill_tokens, prefill_ctx_pairs)
        return max(seconds, self.floor(prefill_tokens, prefill_ctx_pairs, decode_rows, decode_ctx_tokens))

    def floor(self, prefill_tokens: int, prefill_ctx_pairs: float, decode_rows: int, decode_ctx_tokens: int) -> float:
        """The least this pass can cost, from the latest `floor_passes` measured passes (the module docstring):
        for each, ``l = min(1, tokens / its tokens, pairs / its pairs)`` (figures it has) times its seconds less the
        model's cost of the decode rows and contexts this pass lacks against it; the second largest. Non-decreasing
        in every figure; 0 for an empty pass or before two measurements. Plain Python: a few passes, asked a dozen
        times a plan."""
        if len(self._latest) < 2 or (prefill_tokens == 0 and decode_rows == 0):
            return 0.0
        row_s, ctx_s = self.model.decode_row_s, self.model.decode_ctx_token_s
        first = second = 0.0
        for tokens, pairs, rows, ctx, seconds in self._latest:  # comparisons before divisions: it runs per prediction
            share = 1.0
            if tokens and prefill_tokens < tokens:
                share = prefill_tokens / tokens
            if pairs and prefill_ctx_pairs < share * pairs:
                share = prefill_ctx_pairs / pairs
            left = seconds
            if rows > decode_rows:
                left -= row_s * (rows - decode_rows)
            if ctx > decode_ctx_tokens:
                left -= ctx_s * (ctx - decode_ctx_tokens)
            bound = share * left
            if bound > first:
                first, second = bound, first
            elif bound > second:
                second = bound
        return second

    def extrapolation(self, prefill_tokens: int, prefill_ctx_pairs: float) -> float:
        """How many times beyond `trust_factor` x the largest measured pass this one reaches, in prefill tokens or in
        attended pairs (1 within): what its prediction is charged. Non-decreasing in both, so the prediction stays
        so."""
        reach = self.settings.trust_factor
        return max(
            1.0,
            prefill_tokens / (reach * max(1, self.measured_prefill_tokens)),
            prefill_ctx_pairs / (reach * max(1.0, self.measured_prefill_pairs)),
        )

    @property
    def predicts(self) -> bool:
        """Whether `pass_s` answers a figure (from the first fit on); before, no figure of a pass changes its NaN."""
        return self.num_fits > 0

    @property
    def num_window(self) -> int:
        return min(self.num_observed, self.settings.window_passes)

    def observe(
        self, prefill_tokens: int, prefill_ctx_pairs: float, decode_rows: int, decode_ctx_tokens: int, measured_s: float
    ) -> float | None:
        """One measured pass; returns what the model in force predicted for it (None: not a pass to learn from,
        an empty one or a duration that is not a positive number)."""
        if not (measured_s > 0 and math.isfinite(measured_s)) or (prefill_tokens == 0 and decode_rows == 0):
            return None
        figures = (prefill_tokens, prefill_ctx_pairs, decode_rows, decode_ctx_tokens)
        predicted = self.pass_s(*figures) if self.num_fits else self.model.pass_s(*figures)
        self.measured_prefill_tokens = max(self.measured_prefill_tokens, prefill_tokens)
        self.measured_prefill_pairs = max(self.measured_prefill_pairs, prefill_ctx_pairs)
        i = self.num_observed % self.settings.window_passes
        x, j = self._x, NUM_FEATURES * i
        x[j], x[j + 1], x[j + 2], x[j + 3], x[j + 4] = (
            1.0,
            prefill_tokens,
            prefill_ctx_pairs,
            decode_rows,
            decode_ctx_tokens,
        )
        self._y[i] = measured_s
        self._miss[i] = abs(predicted / measured_s - 1.0)
        self._latest.append((prefill_tokens, prefill_ctx_pairs, decode_rows, decode_ctx_tokens, measured_s))
        if self.num_fits > 0 and prefill_tokens > 0:
            self._over.add(measured_s, predicted)
        self.num_observed += 1
        self._since_fit += 1
        if self.frozen_reason is None and self._since_fit >= self.refit_interval():
            self.refit()
        return predicted

    def refit_interval(self) -> int:
        """Passes between refits: `min_passes` for the first fit, then an eighth of the window so far, up to
        `refit_every_passes` (by default every pass from the 8th to the 16th, every other to the 32nd, ..., every 64
        from the 512th): a new engine's first chunks deep in a document each see a fit that has seen the chunk
        before (a fit held for 8 passes predicted them 6-8 times too fast), and a settled one costs a refit every
        64 passes."""
        s = self.settings
        if not self.num_fits:
            return s.min_passes
        return min(s.refit_every_passes, max(1, self.num_window // 8))

    def refit(self) -> LinearPassCost:
        """Fit the window now (`observe` does it every `refit_every_passes` passes)."""
        n = self.num_window
        if n >= self.settings.min_passes:
            x = np.frombuffer(self._x).reshape(-1, NUM_FEATURES)
            self.model = fit_coefficients(x[:n], np.frombuffer(self._y)[:n], self.prior, self.settings)
            self.num_fits += 1
        self._since_fit = 0
        return self.model

    def error(self) -> float | None:
        """Median absolute relative error of the window's predictions (made before each pass joined it)."""
        n = self.num_window
        return float(np.median(np.frombuffer(self._miss)[:n])) if n else None

    @property
    def relative_error(self) -> float:
        """The error the fit states (the module docstring): the `FitSettings.overrun_quantile` quantile of
        ``measured / predicted - 1`` of the latest fitted predictions of passes with prefill, at least 0;
        `FitSettings.prior_error` while they are too few. Recomputed only after a pass with prefill joined them (the
        decode-only passes of a lone stream change nothing here), however often the planner asks."""
        return self._over.stated

    def describe(self) -> dict[str, Any]:
        """The model in force, its window and its error (the pass trace, the diagnostics line, server info)."""
        return {
            "model": "fitted" if self.num_fits else "unfitted",
            "coefficients": self.model.to_dict(),
            "window_passes": self.num_window,
            "observed_passes": self.num_observed,
            "fits": self.num_fits,
            "median_abs_rel_error": self.error(),
            "relative_error": self.relative_error,
            "measured_prefill_tokens": self.measured_prefill_tokens,
            "measured_prefill_pairs": self.measured_prefill_pairs,
            "frozen": self.frozen_reason,
            "attention": self.attention.value,
            "loop_overhead_s": self.loop_overhead_s,
        }
