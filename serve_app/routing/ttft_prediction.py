"""How long a request would wait for its first token on a replica, from the load the replica published.

One pure function, `predict_ttft_s`, is the prediction every placement rule uses (chats go where it is lowest;
documents go where chats elsewhere still keep the TTFT target). Its inputs are what a replica publishes in its
`ReplicaLoad`: outstanding prefill work (`prefill_tokens`), its pass cost (`prefill_tok_per_s`,
`pass_fixed_s`), the pass a new arrival may wait for (`pass_tokens`) and whether a short request overtakes
queued prefill (`short_first`). The model is the one a pass cannot be interrupted implies:

- with `short_first` (the policy's fair share), a request waits for the pass in flight (at most `pass_tokens`
  of the queued prefill, and at most `wait_pass_s` where the engine sizes passes in seconds), then runs in a pass
  of its own: `min(pass(min(queued, pass_tokens)), wait_pass_s) + pass(uncached)`;
- without it (upstream's first come, first served), every token queued before it is prefilled first, in
  passes of `pass_tokens`: `queued / rate + passes * fixed + pass(uncached)`.

`pass(n) = pass_fixed_s + n / prefill_tok_per_s`. A replica that has published no rate predicts nothing
(None): the rules then fall back to counts. Times are the engine's seconds (the simulator's clock on the `sim`
backend, wall seconds on sglang), as the SLO targets are.

What each backend publishes: `wait_pass_tokens`, `interactive_pass_tokens` and `overtakes_queued_prefill` read
them from the policy in force, so the sim and sglang backends say the same thing for the same policy;
`wait_pass_seconds` is the engine's SLO sizer's own bound (`scheduler.slo_sizing.arrival_wait_s`), with the engine's
figures: the sim backend's from its planner and cost model, the sglang backend's as the plugin reports it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from scheduler.config import PolicyConfig
from scheduler.slo_sizing import arrival_wait_s
from serve_app.replica.backend import ReplicaLoad

DEFAULT_TTFT_TARGET_S: float = PolicyConfig.model_fields["ttft_target_s"].default
"""The interactive TTFT target a replica is placed by until it publishes its policy's own."""
OVERLAP_ADMISSION_LAG_PASSES = 1
"""sglang's overlap scheduler on a GPU plans one pass before it sees a request that arrived during the pass in flight
(`scheduler.sglang_plugin.translate.admission_lag_passes`); the simulator plans none (its snapshots count 0)."""


def pass_s(load: ReplicaLoad, tokens: int) -> float:
    """Seconds of one pass prefilling `tokens` on that replica (requires a published rate)."""
    return load.pass_fixed_s + tokens / load.prefill_tok_per_s


def predict_ttft_s(load: ReplicaLoad, uncached_tokens: int) -> float | None:
    """Predicted seconds to the first token of a request with `uncached_tokens` to prefill, sent to a replica with
    this load; None when the replica has published no prefill rate."""
    if load.prefill_tok_per_s <= 0:
        return None
    own = pass_s(load, max(1, uncached_tokens))
    queued = max(0, load.prefill_tokens)
    if queued == 0:
        # Only decoding streams (if any): it waits for at most one decode pass.
        return own + (load.pass_fixed_s if load.num_decoding else 0.0)
    if load.short_first:
        in_flight = min(queued, load.pass_tokens) if load.pass_tokens > 0 else queued
        in_flight_s = pass_s(load, in_flight)
        if load.wait_pass_s > 0:
            in_flight_s = min(in_flight_s, load.wait_pass_s)
        return in_flight_s + own
    passes = math.ceil(queued / load.pass_tokens) if load.pass_tokens > 0 else 1
    return queued / load.prefill_tok_per_s + passes * load.pass_fixed_s + own


def prefill_drain_s(load: ReplicaLoad, uncached_tokens: int) -> float | None:
    """Seconds until the replica has prefilled everything queued plus `uncached_tokens`: a document's first token
    when prefill is shared (None without a published rate)."""
    if load.prefill_tok_per_s <= 0:
        return None
    tokens = max(0, load.prefill_tokens) + max(1, uncached_tokens)
    passes = math.ceil(tokens / load.pass_tokens) if load.pass_tokens > 0 else 1
    return tokens / load.prefill_tok_per_s + passes * load.pass_fixed_s


def with_engine_rate(loads: Mapping[str, ReplicaLoad]) -> dict[str, ReplicaLoad]:
    """The loads with one prefill rate, the highest any of them published (where none has, all stay at 0: the
    rules fall back to counts).

    The replicas of one deployment run one engine on one kind of device: what their measured rates differ by is the
    passes they happened to run. sglang times each prefill pass whole, so a replica that prefilled only chats (tens of
    tokens a pass, each carrying the pass's fixed cost) measures a fraction of the rate of one that prefilled
    documents (on the CPU engines, 2,200 against 4,800 tokens/s), looks twice as slow for the next document, and
    that document joins the replica already prefilling one. A fresh sglang replica, which has measured nothing yet
    (`load_snapshot.PrefillRate`), is placed at what its peers measured."""
    rate = max((ld.prefill_tok_per_s for ld in loads.values()), default=0.0)
    return {
        rid: ld if ld.prefill_tok_per_s == rate else replace(ld, prefill_tok_per_s=rate) for rid, ld in loads.items()
    }


def with_request(load: ReplicaLoad, uncached_tokens: int) -> ReplicaLoad:
    """The load once one more request with `uncached_tokens` to prefill has arrived."""
    return replace(load, num_waiting=load.num_waiting + 1, prefill_tokens=load.prefill_tokens + uncached_tokens)


def overtakes_queued_prefill(policy: PolicyConfig) -> bool:
    """Whether the policy lets a short request ride the next pass ahead of queued prefill (max-min fair share of
    each pass); upstream's rules (fair share off) prefill in arrival order."""
    return policy.fair_share


def wait_pass_tokens(policy: PolicyConfig, chunk_budget_tokens: int) -> int:
    """The largest pass a request arriving now may wait for: with adaptive passes, a quiet pass (the engine sizes
    passes down only once a short request has arrived); otherwise the chunk budget."""
    if policy.adaptive_pass and policy.quiet_pass_tokens is not None:
        return min(chunk_budget_tokens, policy.quiet_pass_tokens)
    return chunk_budget_tokens


def wait_pass_seconds(
    policy: PolicyConfig,
    own_pass_s: float | None = 0.0,
    admission_lag_passes: int = OVERLAP_ADMISSION_LAG_PASSES,
    output_lag_passes: int = 0,
) -> float:
    """The longest pass a request arriving now may wait for, in seconds, where the policy sizes passes from its
    targets; 0 where it does not. The engine's SLO sizer's own bound (`scheduler.slo_sizing.arrival_wait_s`): each
    pass leaves room for a chat arriving during it, the TTFT target less the chat's own pass (`own_pass_s`, the
    sizer's `SloSizer.arrival_own_pass_s`; None: the engine's cost model cannot predict it) and the passes its first
    token waits for after it (`output_lag_passes`), split between the pass in flight and the `admission_lag_passes`
    planned before the engine sees the chat. Without the engine's figures (the defaults): sglang's overlap scheduler
    on a GPU and no own pass, half the target."""
    return arrival_wait_s(policy, own_pass_s, admission_lag_passes, output_lag_passes)


def interactive_pass_tokens(policy: PolicyConfig, chunk_budget_tokens: int) -> int:
    """The pass size while short requests are active (adaptive passes); 0 when the policy has no such sizing."""
    return min(chunk_budget_tokens, policy.interactive_pass_tokens) if policy.adaptive_pass else 0
