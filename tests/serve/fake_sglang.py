"""A stand-in for `sglang.Engine` with the calls the sglang backend makes outside sglang's serving classes.

It records the constructor's arguments and the `FAIRSHARE_*` environment the scheduler process would
inherit at that moment, so tests see exactly what a real engine would have started with.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar


class FakeTokenizerManager:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort_request(self, rid: str) -> None:
        self.aborted.append(rid)

    async def get_loads(self) -> list[Any]:
        return []

    async def get_internal_state(self) -> list[dict[str, Any]]:
        """One scheduler's internal state, with the plugin's live state as it reports it."""
        return [{"max_total_num_tokens": 4096, "fairshare": dict(FakeSglangEngine.policy_state)}]


class FakeSglangEngine:
    started: ClassVar[list[FakeSglangEngine]] = []
    policy_state: ClassVar[dict[str, Any]] = {}
    """What the plugin reports in the scheduler's internal state (`SchedulerPolicy.describe`)."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.env = {k: v for k, v in os.environ.items() if k.startswith("FAIRSHARE_")}
        self.tokenizer_manager = FakeTokenizerManager()
        FakeSglangEngine.started.append(self)

    def shutdown(self) -> None:
        pass
