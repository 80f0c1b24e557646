"""Stop sequences enforced by laneway on the stream itself, so every engine behaves alike.

The matcher holds back only the tail of the text that could still be the start of a stop
string; a stop split across deltas is therefore never emitted, and nothing else is delayed.
"""

from __future__ import annotations

from collections.abc import Iterable


class StopMatcher:
    def __init__(self, stops: Iterable[str], *, keep_stop: bool = False) -> None:
        self.stops = tuple(s for s in dict.fromkeys(stops) if s)
        self.keep_stop = keep_stop  # include_stop_str_in_output: the stop string is part of the answer
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text (Anthropic's stop_sequence)

    def feed(self, text: str) -> str:
        """Return the text that is safe to emit now; sets `stopped` when a stop string appears."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        found = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if found:
            cut, stop = min(found, key=lambda f: (f[0], -len(f[1])))  # the first; at a tie, the longest
            self.stopped = True
            self.matched = stop
            self._held = ""
            return buf[: cut + len(stop)] if self.keep_stop else buf[:cut]
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of generation the held tail was not a stop after all: release it."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best
