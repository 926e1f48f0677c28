"""Fair-share chunking: how many prefill tokens each request gets in a pass.

The article's rule is ``cap = min(F, budget / (n_prefilling + n_waiting))``. We apply it as a
max-min (water-filling) share among the requests that can actually run this pass: a short
request takes what it needs (it is never cut for F) and the long ones share the rest, each capped
at F when the pass is contended. Alone, a request may take the whole pass budget. Budget the caps
leave unused goes back to long requests in order when passes are sized adaptively (the pass
budget, not F, then bounds the pass). The planner also finishes a half-prefilled request with
spare budget when that frees the one cut slot for the next, rather than leave it cut for want of
a few tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.config import PolicyConfig


def align_down(tokens: int, granule: int) -> int:
    return tokens // granule * granule


def per_request_cap(cfg: PolicyConfig, pass_budget: int, num_sharing: int) -> int:
    """The most tokens one long request may take this pass before any top-up."""
    if not cfg.fair_share:
        return pass_budget
    if num_sharing <= 1 and cfg.full_budget_when_alone:
        return pass_budget
    # The budget / n part of the article's rule is the water fill's job.
    return min(cfg.cap_tokens, pass_budget)


def water_fill(wants: Sequence[int], budget: int) -> list[int]:
    """Max-min fair shares of `budget` for `wants`."""
    shares = [0] * len(wants)
    left = budget
    active = [i for i, w in enumerate(wants) if w > 0]
    while active and left > 0:
        level = left // len(active)
        if level == 0:
            break
        # Requests wanting no more than the level are satisfied whole; the rest share again.
        done = [i for i in active if wants[i] - shares[i] <= level]
        if not done:
            for i in active:
                shares[i] += level
                left -= level
            break
        for i in done:
            left -= wants[i] - shares[i]
            shares[i] = wants[i]
        active = [i for i in active if i not in done]
    return shares


def top_up(shares: list[int], demands: Sequence[int], budget: int, eligible: Sequence[int]) -> None:
    """Give budget left after the fair shares to `eligible` requests, in order."""
    left = budget - sum(shares)
    for i in eligible:
        if left <= 0:
            break
        take = min(demands[i] - shares[i], left)
        shares[i] += take
        left -= take


def align(shares: Sequence[int], demands: Sequence[int], granule: int) -> list[int]:
    """Chunk sizes are granule multiples, except a share that completes its request."""
    return [s if s == d else align_down(s, granule) for s, d in zip(shares, demands, strict=True)]


def sequential_fill(demands: Sequence[int], budget: int, granule: int = 1) -> list[int]:
    """Upstream's rule: first come takes what it needs until the budget runs out."""
    shares = []
    left = budget
    for d in demands:
        take = d if d <= left else align_down(left, granule)
        shares.append(take)
        left -= take
    return shares
