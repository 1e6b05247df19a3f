"""A worker process that ends with its parent: an export worker must not outlive a SIGKILLed `spec-export`.

    die_with_parent(parent_pid)   Linux: prctl(PR_SET_PDEATHSIG, SIGKILL); elsewhere nothing (the parent's
                                  cleanup on SIGINT / SIGTERM still stops it: staging.run_isolated)
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when the thread that started it exits (run_isolated waits in that
    thread until the worker ends); if the parent is already gone, end now."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):  # no libc symbol: the worker simply keeps the old behaviour
        return
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)
