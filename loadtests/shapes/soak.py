"""A soak: `--soak-users` users of the configured mix (`--chat-weight`, `--doc-weight`) for `--soak-s`."""

from loadtests.settings import LoadSettings
from loadtests.shapes.timeline import StagedShape
from loadtests.stages import Stage, soak_stages


class SoakShape(StagedShape):
    def stages(self, s: LoadSettings) -> list[Stage]:
        return soak_stages(s)
