"""How many examples a property test draws: its full count under `make test` (CI), at most the ``fast`` profile's
in `make test-fast` (``--hypothesis-profile=fast``), the loop run while changing the policy. A property a change
breaks usually fails within the first few dozen examples; the full counts in CI look further."""

from __future__ import annotations

from hypothesis import settings

FAST_PROFILE = "fast"
settings.register_profile(FAST_PROFILE, max_examples=50)


def examples(full: int) -> int:
    """`full`, or the fast profile's count where that is lower and the fast profile is loaded."""
    if settings.get_current_profile_name() == FAST_PROFILE:
        return min(full, settings.get_profile(FAST_PROFILE).max_examples)
    return full
