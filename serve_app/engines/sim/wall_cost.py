"""The preset's pass cost as a replica runs it in real time: the same predictions, and the error the replica's
passes show against them on this machine.

The simulated engine charges each pass exactly its preset's cost, so offline its passes run as predicted and the SLO
sizer may plan them right up to a target. A replica runs them in wall time on a shared machine: a pass ends when its
task wakes, up to milliseconds late, and a chat's gap between tokens is then a little over a pass sized to the
time-between-tokens target (the ramp measured 0.301-0.31 s gaps against 0.3 s). So the replica states the error its
own passes show, the way an engine's fitted cost does (`scheduler.pass_cost.Overruns`, the rule the plugin's online
fit states by), and the sizer charges every predicted pass with it. The engine loop times each pass it slept
(`EngineLoop`); time scaled to 0 runs no pass in wall time and states no error.
"""

from __future__ import annotations

from scheduler.pass_cost import Overruns, PassCost
from scheduler.pass_cost_fit import FitSettings

SETTINGS = FitSettings()
"""The window and minimum count of the plugin's fit."""


class WallClockCost:
    def __init__(self, preset: PassCost, overrun_quantile: float) -> None:
        self.preset = preset
        self.overruns = Overruns(SETTINGS.error_window_passes, SETTINGS.error_min_passes, overrun_quantile, prior=0.0)
        """How the replica's latest passes with prefill ran in wall time against their predictions."""

    def pass_s(self, prefill_tokens: int, prefill_ctx_pairs: float, decode_rows: int, decode_ctx_tokens: int) -> float:
        return self.preset.pass_s(prefill_tokens, prefill_ctx_pairs, decode_rows, decode_ctx_tokens)

    @property
    def relative_error(self) -> float:
        return self.overruns.stated
