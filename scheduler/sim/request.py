"""A request inside the simulated engine, with the timestamps metrics are made from."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum

from scheduler.tenants import DEFAULT_TENANT
from scheduler.traffic import TrafficClass


class Phase(Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(eq=False)
class SimRequest:
    rid: str
    prompt_tokens: int
    output_tokens: int
    arrival_s: float
    traffic_class: TrafficClass = TrafficClass.SHORT
    cached_tokens: int = 0
    session: str | None = None
    tenant: str = DEFAULT_TENANT
    tenant_weight: float | None = None
    """Its tenant's weight as the request carries it; None = the policy's (`scheduler.tenants`)."""

    phase: Phase = Phase.WAITING
    num_prefilled: int = 0
    num_generated: int = 0
    kv_held_tokens: int = 0
    admitted_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    decode_passes_stalled: int = 0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(f"{self.rid}: prompt_tokens and output_tokens must be >= 1")
        if not 0 <= self.cached_tokens < self.prompt_tokens:
            raise ValueError(f"{self.rid}: cached_tokens={self.cached_tokens} must be below prompt_tokens")

    @property
    def extend_tokens(self) -> int:
        """Prompt tokens still to prefill."""
        return self.prompt_tokens - self.cached_tokens - self.num_prefilled

    @property
    def context_tokens(self) -> int:
        return self.cached_tokens + self.num_prefilled + self.num_generated

    @property
    def kv_need_tokens(self) -> int:
        """What admission must find free: the whole uncached prompt plus the output (sglang's rule)."""
        return self.prompt_tokens - self.cached_tokens + self.output_tokens

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    def itls_s(self) -> list[float]:
        t = self.token_times_s
        return [b - a for a, b in itertools.pairwise(t)]
