"""A step ramp that finds the knee: `--ramp-step-users` more users every `--ramp-step-s`, up to
`--ramp-max-users`; the test stops after the first step whose short TTFT p99 is above `--knee-ttft-s`.
The benchmark's report prints short TTFT p99 per step (users vs p99)."""

from loadtests.settings import LoadSettings
from loadtests.shapes.timeline import StagedShape
from loadtests.stages import KneeWatch, Stage, ramp_stages


class StepRampShape(StagedShape):
    def __init__(self) -> None:
        super().__init__()
        self.knee = KneeWatch()

    def stages(self, s: LoadSettings) -> list[Stage]:
        return ramp_stages(s)

    def stop_before(self, index: int) -> bool:
        s = self.settings()
        entry = self.runner.stats.get("short", "TTFT")  # type: ignore[union-attr]
        return self.knee.crossed(index, entry, s.knee_ttft_s * s.time_scale * 1000)
