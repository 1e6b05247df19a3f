"""A process's peak resident memory, as the kernel keeps it for the process's current image."""

from __future__ import annotations

import os


def peak_rss_kb(pid: int | None = None) -> int:
    """VmHWM of /proc/PID/status (this process when None), in kB; 0 once the process is gone or where /proc has
    no VmHWM. Unlike getrusage / wait4's ru_maxrss it counts only the image since the last exec: a process forked
    from a larger one (a benchmark's child) does not inherit its parent's peak."""
    try:
        with open(f"/proc/{pid if pid is not None else os.getpid()}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
