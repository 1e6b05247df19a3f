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
