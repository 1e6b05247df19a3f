"""Test helpers for the server: a real pack that can be slowed down, polling, and reading Prometheus text.

    SlowPack(pack).delay = 0.05               # each on_text call of pack.run waits first (a test can act mid-decode)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class SlowPack:
    """A real pack whose run() (what the server calls) pauses `delay` seconds before each on_text call and counts the
    calls."""

    def __init__(self, pack: Any) -> None:
        self._pack = pack
        self.delay = 0.0
        self.pieces = 0  # on_text calls of the last run()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pack, name)

    def run(self, *args: Any, on_text: Callable[[str], None] | None = None, **kwargs: Any) -> Any:
        self.pieces = 0

        def slow(piece: str) -> None:
            time.sleep(self.delay)
            self.pieces += 1
            assert on_text is not None
            on_text(piece)

        return self._pack.run(*args, on_text=slow if on_text is not None else None, **kwargs)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def metric(text: str, name: str) -> float:
    """The value of one sample (`name` with its labels, as written) in Prometheus text, 0 when absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0
