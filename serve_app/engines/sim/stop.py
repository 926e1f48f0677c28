"""Stop sequences over a stream that arrives in chunks.

Output ends where a stop sequence is first complete; the stop sequence itself is not sent. A stop
sequence may straddle chunks, so text that could be the start of one is held back until the next
chunk tells (as engines do): what a client receives does not depend on how the stream was chunked.
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self._held = ""
        """Text not sent yet: it ends with the beginning of a stop sequence."""

    def feed(self, text: str) -> tuple[str, bool]:
        """The text that may go out now, and whether a stop sequence ended the output (the stop is not sent)."""
        window = self._held + text
        # Generation stops where a stop sequence is first complete (the earliest end; at one end, the longer
        # sequence): the engine never sees the text after it, so a sequence that starts earlier but would end
        # later does not count. `find` gives each sequence's first, so earliest-ending, occurrence.
        found = [(i + len(s), -len(s), i) for s in self.stops if (i := window.find(s)) >= 0]
        if found:
            self._held = ""
            return window[: min(found)[2]], True
        keep = self._stop_prefix_at_end(window)
        self._held = window[len(window) - keep :]
        return window[: len(window) - keep], False

    def flush(self) -> str:
        """At the end of the output: what was held back is plain text after all."""
        held, self._held = self._held, ""
        return held

    def _stop_prefix_at_end(self, window: str) -> int:
        """Length of the longest end of `window` that begins some stop sequence (0: none)."""
        longest = max((len(s) for s in self.stops), default=1) - 1
        for k in range(min(len(window), longest), 0, -1):
            if any(s.startswith(window[-k:]) for s in self.stops):
                return k
        return 0
