"""Up and down: low, a climb by `--ramp-step-users` every `--ramp-step-s` to `--ramp-max-users`, a plateau, the
same steps down, low again (`up_down_stages`). The autoscaling benchmark's load (`benchmarks.autoscale_ramp`)."""

from loadtests.settings import LoadSettings
from loadtests.shapes.timeline import StagedShape
from loadtests.shapes.up_down_stages import up_down_stages
from loadtests.stages import Stage


class UpDownShape(StagedShape):
    def stages(self, s: LoadSettings) -> list[Stage]:
        return up_down_stages(s)
