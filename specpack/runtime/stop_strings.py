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

    TextOut(tokenizer, stops, on_text)   one request's text (Pack.run): tokens -> text pieces -> stop strings cut ->
                                         on_text; a hit halts the loop (halt(cancel)) and ends it as "stop"
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from specpack.errors import SpecpackError

if TYPE_CHECKING:
    from specpack.runtime.tokenizer import PackTokenizer


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


class _StopOrCancel(threading.Event):
    """What the loop checks before every step: a stop string was hit, or the caller's cancel is set."""

    def __init__(self, matcher: StopMatcher, cancel: threading.Event | None) -> None:
        super().__init__()
        self._matcher, self._cancel = matcher, cancel

    def is_set(self) -> bool:
        return self._matcher.hit is not None or (self._cancel is not None and self._cancel.is_set())


class TextOut:
    """One request's text as it is decoded: ids -> text pieces (the tokenizer's stream) -> stop strings cut -> on_text.

    Without stop strings and on_text nothing is streamed (the text is decoded once at the end); without stop strings
    the text is the tokenizer's decode of every new token, with them the text up to the first stop string.
    """

    def __init__(self, tokenizer: PackTokenizer, stops: Sequence[str], on_text: Callable[[str], None] | None) -> None:
        self._tokenizer, self._on_text = tokenizer, on_text
        self._matcher = StopMatcher(stops) if stops else None
        self.streaming = on_text is not None or self._matcher is not None
        self._stream = tokenizer.stream() if self.streaming else None
        self._pieces: list[str] = []  # the text emitted so far (with stop strings)

    def halt(self, cancel: threading.Event | None) -> threading.Event | None:
        """The loop's cancel event: the caller's, or with stop strings, also set once one was hit."""
        return cancel if self._matcher is None else _StopOrCancel(self._matcher, cancel)

    def push(self, new: list[int]) -> None:
        """The loop's on_tokens: new token ids."""
        assert self._stream is not None
        for token in new:
            if text := self._stream.push(token):
                self._emit(text)

    def finish(self, finish_reason: str, tokens: list[int]) -> tuple[str, str]:
        """(finish_reason, text) once the loop returned: the held text flushed; "stop" when a stop string was hit."""
        if self._stream is not None and (rest := self._stream.flush()):
            self._emit(rest)
        if self._matcher is None:
            return finish_reason, self._tokenizer.decode(tokens)
        if self._matcher.hit is not None:
            return "stop", "".join(self._pieces)
        if tail := self._matcher.flush():
            self._out(tail)
        return finish_reason, "".join(self._pieces)

    def _emit(self, text: str) -> None:
        if self._matcher is None:
            self._out(text)
        elif self._matcher.hit is None and (cut := self._matcher.push(text).text):
            self._out(cut)

    def _out(self, text: str) -> None:
        if self._matcher is not None:
            self._pieces.append(text)
        if self._on_text is not None:
            self._on_text(text)
