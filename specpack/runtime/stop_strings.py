"""Stop strings, matched incrementally on streamed text (OpenAI semantics).

Generation ends right before the first occurrence of any stop string; the stop string itself is not part of
the output. Text arrives in pieces (one per decoded token or so), and a stop string can straddle pieces, so
the matcher holds back the longest tail of the text that could still begin a stop string and releases it
once it cannot (or when generation ends without a match).

    matcher = StopMatcher(["\\n\\n", "```"])
    for piece in pieces:
        out = matcher.push(piece)      # out.text: safe to emit now; out.stopped: a stop string was hit
        emit(out.text)
        if out.stopped:
            break
    else:
        emit(matcher.flush())          # generation ended without a stop string: the held tail is plain text
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from specpack.errors import SpecpackError


class Matched(NamedTuple):
    text: str        # text that is now safe to emit ("" while a possible stop string is held back)
    stopped: bool    # a stop string was hit: `text` ends right before it, and nothing more will come


class StopMatcher:
    """Feed text pieces with push(); each returns what can be emitted and whether a stop string was hit."""

    def __init__(self, stops: Sequence[str]) -> None:
        bad = [s for s in stops if not isinstance(s, str) or not s]
        if bad:
            raise SpecpackError("invalid stop string", expected="non-empty strings", found=repr(bad[0]))
        self.stops = tuple(stops)
        self.hit: str | None = None   # the stop string that ended generation, once one did
        self._held = ""               # the tail that could begin a stop string

    def push(self, piece: str) -> Matched:
        """Add decoded text; after a stop string was hit, everything is dropped."""
        if self.hit is not None:
            return Matched("", True)
        text = self._held + piece
        first = self._first_match(text)
        if first is not None:
            at, self.hit = first
            self._held = ""
            return Matched(text[:at], True)
        keep = self._partial_tail(text)
        self._held = text[len(text) - keep:] if keep else ""
        return Matched(text[: len(text) - keep], False)

    def flush(self) -> str:
        """Generation ended without a stop string: release the held tail."""
        rest, self._held = self._held, ""
        return rest

    def _first_match(self, text: str) -> tuple[int, str] | None:
        """(position, stop string) of the earliest stop string in `text`, or None."""
        found = [(at, stop) for stop in self.stops if (at := text.find(stop)) >= 0]
        return min(found) if found else None

    def _partial_tail(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
