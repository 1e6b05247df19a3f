"""Where specpack keeps what it downloads and derives (models, GGUF conversions, calibration results)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The specpack cache: `$SPECPACK_CACHE`, else `~/.cache/specpack`."""
    env = os.environ.get("SPECPACK_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specpack"
