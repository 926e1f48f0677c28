"""Stop sequences over a stream that arrives in chunks: a stop may straddle two chunks."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self._tail_chars = max((len(s) for s in stops), default=0)
        self._tail = ""
        """The end of the text already sent, as long as the longest stop: enough to see a straddling one."""

    def cut(self, new_text: str) -> int | None:
        """Index in `new_text` where the first stop sequence begins (None: no stop), then remember the text."""
        if not self.stops or not new_text:
            return None
        window = self._tail + new_text
        found = [i for i in (window.find(s) for s in self.stops) if i >= 0]
        self._tail = window[-self._tail_chars :]
        if not found:
            return None
        return max(0, min(found) - (len(window) - len(new_text)))
