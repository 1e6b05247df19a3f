"""Loading a pack from the command line where the user can see it: a status line before, the time it took after."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click


def load_pack_visibly(pack: Path, *, quiet: bool = False, **options: Any) -> tuple[Any, float]:
    """specpack.load(pack, **options) and the seconds it took; unless `quiet`, one line on stderr before and after
    (checking the files and opening the target takes seconds to tens of seconds for a real pack)."""
    import specpack

    if not quiet:
        click.echo(f"[specpack] loading {pack} (checking its files, opening the target) ...", err=True)
    start = time.perf_counter()
    loaded = specpack.load(pack, **options)
    seconds = time.perf_counter() - start
    if not quiet:
        draft = " (the draft model opens on its first use, inside the first token's time)" \
            if loaded.default_drafter == "model" else ""
        click.echo(f"[specpack] loaded in {seconds:.1f} s{draft}", err=True)
    return loaded, seconds
