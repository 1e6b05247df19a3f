"""Functions run in spawned worker processes by tests/export/test_staging.py (importable by module name)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from specpack.errors import SpecpackError


def write_forever(folder: Path) -> None:
    """Keep writing into `folder`, as an export worker does; record this process's pid first."""
    (folder / "child.pid").write_text(str(os.getpid()))
    while True:
        with open(folder / "weights.bin", "ab") as f:
            f.write(b"x" * 1024)
        time.sleep(0.05)


def refuse(what: str) -> None:
    raise SpecpackError(what, expected="something else", found="this")


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def answer(x: int) -> int:
    return x * 2


def wait_for(path: Path) -> str:
    """Return once `path` exists (another worker makes it): only workers that run at once both finish."""
    deadline = time.monotonic() + 60
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)
    return "seen"


def make(path: Path) -> str:
    path.write_text("here")
    return "made"
