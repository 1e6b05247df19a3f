"""The server's file-descriptor budget.

Every connection costs a descriptor. `fit_descriptors` raises the process's soft limit (`ulimit -n`) up to its
hard limit so that --max-connections plus RESERVE fit, or refuses to start. Should the limit still be reached
(descriptors used elsewhere), accept() fails: asyncio logs a traceback per failed call, up to a listen backlog's
worth per tick (64 MB of log in 30 s were seen). `AcceptErrorLog` turns those into one line per INTERVAL_S;
asyncio keeps retrying every second, and the open connections are served meanwhile.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from typing import Any

from specpack.errors import SpecpackError

log = logging.getLogger("specpack.serve")
RESERVE = 64        # descriptors besides connections: the pack's files, the listening socket, the event loop, logs
INTERVAL_S = 10.0   # at most one log line per this long about failed accepts
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def fit_descriptors(max_connections: int) -> int:
    """The soft RLIMIT_NOFILE after making room for max_connections + RESERVE (raised up to the hard limit)."""
    try:
        import resource
    except ImportError:  # not on this platform (Windows): nothing to fit
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_connections + RESERVE
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft
    if hard != resource.RLIM_INFINITY and hard < need:
        raise SpecpackError(f"--max-connections {max_connections} does not fit the file-descriptor limit",
                            expected=f"a limit of at least {need} ({max_connections} + {RESERVE} for the server itself)",
                            found=f"ulimit -n {soft} (hard limit {hard})",
                            hint=f"lower --max-connections to {max(1, hard - RESERVE)} or less, or raise `ulimit -Hn`")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    return need


class AcceptErrorLog:
    """An event-loop exception handler: accept() out of descriptors or memory is logged once per INTERVAL_S
    (with how many more failed meanwhile), without a traceback; anything else goes to asyncio's own handler."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.last = float("-inf")
        self.suppressed = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if not (isinstance(exc, OSError) and exc.errno in OUT_OF_RESOURCES and "accept" in context.get("message", "")):
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - self.last < self.interval_s:
            self.suppressed += 1
            return
        log.warning("cannot accept new connections: %s (%d more failures since the last warning); the open ones are "
                    "still served, accepting resumes when descriptors free up", exc.strerror, self.suppressed)
        self.last, self.suppressed = now, 0
