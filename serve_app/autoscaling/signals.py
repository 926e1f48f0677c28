"""What one Engine replica publishes for the autoscaling policy (`Engine.record_autoscaling_stats`).

Serve calls the method on every replica, keeps each key's samples over `look_back_period_s` and hands the policy
each key's aggregate per replica (`AutoscalingContext.aggregated_metrics`: a time-weighted mean by default, Serve's
`aggregation_function`). The keys are the field names of `ReplicaSignals`; none is Serve's own `running_requests`,
which a custom key of that name would overwrite in the same report.

Times are the engine's seconds, as its TTFT target is (the simulator's clock on the `sim` backend).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.config import PolicyConfig
from serve_app.replica.backend import ReplicaLoad
from serve_app.routing.ttft_prediction import predict_ttft_s

ATTAINMENT_WINDOW_S = 20.0
"""A replica's `chat_slo_attainment` counts the verdicts of its latest 20 s (`serve_app.replica.chat_slo`). Serve
then averages what it publishes over `look_back_period_s`, so the policy settles that much longer after a
scale-up (`serve_policy`)."""
CHAT_PROBE_TOKENS = 256
"""The uncached prompt of the "new short chat" whose TTFT a replica predicts: a chat turn, well under any
`short_request_tokens`. (Routers probe with the chats they routed lately; a replica has no such record.)"""


@dataclass(frozen=True, slots=True)
class ReplicaSignals:
    """One replica's view of its own service level. None: the replica cannot say (no prefill rate measured yet, no
    attainment source): that key is left out of what it publishes."""

    engine_running_requests: float
    """Admitted requests: prefilling or decoding."""
    engine_queued_requests: float
    """Requests the engine has not admitted yet."""
    engine_max_running_requests: float
    """The engine's running slots (0: not known)."""
    chat_ttft_target_s: float
    """The TTFT target of the replica's policy (`PolicyConfig.ttft_target_s`)."""
    queued_prefill_s: float | None = None
    """Uncached prompt tokens still to prefill, in seconds of the engine's prefill rate."""
    predicted_chat_ttft_s: float | None = None
    """`predict_ttft_s` of a new chat of `CHAT_PROBE_TOKENS` sent to this replica now."""
    chat_slo_attainment: float | None = None
    """Share of the replica's latest chats that met the chat SLO (TTFT and TBT targets), judged as their bytes left
    it (`serve_app.replica.chat_slo`); None while too few were judged."""

    def to_metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, float]) -> ReplicaSignals | None:
        """The signals in one replica's aggregated metrics; None when it has published none of its required keys
        yet (a replica starting, or whose engine is loading)."""
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        if any(name not in metrics for name in required):
            return None
        return cls(**{f.name: metrics[f.name] for f in dataclasses.fields(cls) if f.name in metrics})

    @property
    def ttft_ratio(self) -> float | None:
        """Predicted chat TTFT as a fraction of the target (None: no prediction)."""
        if self.predicted_chat_ttft_s is None:
            return None
        return self.predicted_chat_ttft_s / self.chat_ttft_target_s

    @property
    def requests(self) -> float:
        return self.engine_running_requests + self.engine_queued_requests


def replica_signals(
    load: ReplicaLoad, policy: PolicyConfig, chat_slo_attainment: float | None = None
) -> ReplicaSignals | None:
    """The signals of a replica with this load under this policy, and the share of its latest chats that met the SLO
    (`serve_app.replica.chat_slo`; None: too few judged); None while its engine is not ready (it publishes nothing,
    and the policy counts it as capacity still coming)."""
    if not load.ready:
        return None
    rate = load.prefill_tok_per_s
    return ReplicaSignals(
        engine_running_requests=load.num_prefilling + load.num_decoding,
        engine_queued_requests=load.num_waiting,
        engine_max_running_requests=load.max_running_requests,
        chat_ttft_target_s=policy.ttft_target_s,
        queued_prefill_s=max(0, load.prefill_tokens) / rate if rate > 0 else None,
        predicted_chat_ttft_s=predict_ttft_s(load, CHAT_PROBE_TOKENS),
        chat_slo_attainment=chat_slo_attainment,
    )
