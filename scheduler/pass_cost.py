"""What a forward pass costs: the one interface every pass-cost model answers.

The simulator's presets (`scheduler.sim.cost_model.CostModel`) and the cost model fitted online from an
engine's measured passes both answer `pass_s`; the policy sizes passes from whichever the engine gives it.
A pass's cost depends on its prefill tokens, the context those tokens attend to, and the decoding rows riding
along with their contexts. A model may also state how far off its predictions run (`stated_error_of`), which the
SLO sizer charges every predicted pass with.
"""

from __future__ import annotations

import math
from collections import deque
from enum import StrEnum
from typing import Protocol

import numpy as np


class AttentionWork(StrEnum):
    """What an engine's attention kernel computes for a chunk of `tokens` new tokens after `start` in KV."""

    QUERIES = "queries"
    """Each new token attends to its prefix (FlashInfer, FlashAttention, the simulator): `chunk_ctx_pairs`."""
    PADDED_CAUSAL = "padded_causal"
    """The causal square of the whole sequence so far, whatever the chunk (sglang's ``torch_native`` backend pads a
    chunk's queries to the sequence's length): a one-token chunk deep in a document costs as much as a whole pass
    over it. Decoding rows riding in an extend pass (mixed chunk) are such one-token chunks; a decode-only pass has
    its own kernel (one query a row)."""


class PassCost(Protocol):
    def pass_s(self, prefill_tokens: int, prefill_ctx_pairs: float, decode_rows: int, decode_ctx_tokens: int) -> float:
        """Seconds one forward pass takes. `prefill_ctx_pairs`: the attention pairs of its extend rows
        (`extend_pairs` summed over them); `decode_ctx_tokens`: the decoding rows' contexts, summed, where they are
        not counted in the pairs (`riding_figures`). A model may name its engine's attention work (an
        ``attention`` attribute, `attention_of`); without one it is `AttentionWork.QUERIES`. It may state its
        relative error (a ``relative_error`` attribute, `stated_error_of`); without one it is exact."""
        ...


def attention_of(cost: object) -> AttentionWork:
    return getattr(cost, "attention", AttentionWork.QUERIES)


def stated_error_of(cost: object) -> object:
    """The relative error a model states for its predictions (its ``relative_error``: a pass may run up to
    ``1 + error`` times its prediction); 0 for a model that states none, as the simulator's presets, which are the
    simulated engine's costs by construction. Returned as the model answers it: the SLO sizer checks it."""
    return getattr(cost, "relative_error", 0.0)


def loop_overhead_of(cost: object) -> float:
    """Seconds the engine's scheduler spends between two back-to-back passes that the model's passes do not include
    (its ``loop_overhead_s``): on a device that runs a pass within its launch (CPU), the loop's own work between
    them (the last result processed, the next pass planned and built). 0 for a model that has none: the simulator's
    presets, and a GPU's overlap loop, whose passes are timed result to result, the loop's work inside."""
    return float(getattr(cost, "loop_overhead_s", 0.0))


class Overruns:
    """The error a model states from how its latest predictions ran: the `quantile` quantile of ``measured /
    predicted - 1`` over the latest `window` passes added, at least 0; `prior` while fewer than `min_count` were.
    `scheduler.pass_cost_fit` says why a tail quantile of the latest passes. Recomputed only after a pass was added,
    however often the planner asks."""

    def __init__(self, window: int, min_count: int, quantile: float, prior: float) -> None:
        self.latest: deque[float] = deque(maxlen=window)
        self.min_count, self.quantile, self.prior = min_count, quantile, prior
        self._num_added = 0
        """Passes ever added: the stated error's input changed when this did."""
        self._stated: tuple[int, float] | None = None

    def add(self, measured_s: float, predicted_s: float) -> None:
        self.latest.append(measured_s / predicted_s - 1.0 if predicted_s > 0 else math.inf)
        self._num_added += 1

    @property
    def stated(self) -> float:
        if self._stated is None or self._stated[0] != self._num_added:
            error = self.prior
            if len(self.latest) >= self.min_count:
                error = max(0.0, float(np.quantile(self.latest, self.quantile, method="inverted_cdf")))
            self._stated = (self._num_added, error)
        return self._stated[1]


def chunk_ctx_pairs(start: int, tokens: int) -> float:
    """Attention pairs for prefilling tokens [start, start + tokens): each attends to its prefix."""
    return tokens * start + tokens * (tokens + 1) / 2


def extend_pairs(work: AttentionWork, start: int, tokens: int) -> float:
    """Attention pairs an engine computes to extend a sequence of `start` tokens in KV by `tokens` (none for 0)."""
    if work is AttentionWork.PADDED_CAUSAL and tokens > 0:
        return chunk_ctx_pairs(0, start + tokens)
    return chunk_ctx_pairs(start, tokens)


def riding_figures(work: AttentionWork, with_prefill: bool, rows: int, rows_ctx_tokens: int) -> tuple[float, int]:
    """(attention pairs, decode context tokens) of `rows` decoding streams with contexts summing to
    `rows_ctx_tokens` in a pass that does or does not prefill. Under `AttentionWork.PADDED_CAUSAL` rows riding in
    an extend pass cost each the square of its context; from the sum alone this is bounded by the square of the
    sum (exact for one stream, the long one that costs; an overestimate for several long ones)."""
    if work is AttentionWork.PADDED_CAUSAL and with_prefill and rows:
        return chunk_ctx_pairs(0, rows_ctx_tokens), 0
    return 0.0, rows_ctx_tokens
