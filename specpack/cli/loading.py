"""Loading a pack from the command line where the user can see it: a status line before, the time it took after."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click


def load_pack_visibly(pack: Path, *, quiet: bool = False, drafter: str | None = None, drafts: bool = False,
                      **options: Any) -> tuple[Any, float]:
    """specpack.load(pack, **options) and the seconds it took; unless `quiet`, one line on stderr before and after
    (checking the files and opening the target takes seconds to tens of seconds for a real pack). drafts: the command
    will draft with `drafter` (None: the pack's own), so a draft model or head is opened here too, counted in the load:
    otherwise it opens on its first proposal, inside the decode's time."""
    import specpack

    if not quiet:
        click.echo(f"[specpack] loading {pack} (checking its files, opening the target) ...", err=True)
    start = time.perf_counter()
    loaded = specpack.load(pack, **options)
    opened = drafts and loaded.drafter_named(drafter)[0] != "ngram"
    if opened:
        with loaded.exclusive() as backend:
            backend.draft()
    seconds = time.perf_counter() - start
    if not quiet:
        click.echo(f"[specpack] loaded in {seconds:.1f} s" + (" (the draft too)" if opened else ""), err=True)
    return loaded, seconds
