"""Phase lines for long export stages: what starts, a heartbeat while it runs, and how long it took.

    with phase("quantizing the target (int4)", log):   ->  [spec-export] quantizing the target (int4) ...
        ...                                                [spec-export]   ... quantizing the target (int4): 1 min 0 s so far
                                                           [spec-export] quantizing the target (int4): done in 2 min 11 s

Converting, exporting, quantizing and measuring fidelity take minutes each on a CPU; the heartbeat says the
export is alive (the stage itself runs in a child process and prints nothing).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

HEARTBEAT_S = 60.0


def duration(seconds: float) -> str:
    """1.2 s, 42 s, 3 min 17 s."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


@contextmanager
def phase(what: str, log: Callable[[str], None], every_s: float = HEARTBEAT_S) -> Iterator[None]:
    """Log `what ...`, then every `every_s` seconds how long it has run, then `what: done in T` (not on failure)."""
    log(f"{what} ...")
    start = time.monotonic()
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(every_s):
            log(f"  ... {what}: {duration(time.monotonic() - start)} so far")

    beat = threading.Thread(target=heartbeat, daemon=True, name="spec-export-heartbeat")
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
    log(f"{what}: done in {duration(time.monotonic() - start)}")
