"""`spec-export` / `specpack export`: a draft and a target model in, a pack out."""

from __future__ import annotations

from pathlib import Path

import click

from specpack.cli.errors import user_errors
from specpack.export.config import DEFAULT_K, DTYPES, K_MAX, K_MIN, ExportConfig


@click.command("export")
@click.option("--draft", "draft", required=True, help="Draft model: HF model directory, hub id or .gguf file.")
@click.option("--target", "target", required=True, help="Target model: HF model directory, hub id or .gguf file.")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path), help="Pack directory to write.")
@click.option("--k", "k", type=int, default=DEFAULT_K, show_default=True, help=f"k_max: drafts per step, {K_MIN}..{K_MAX}.")
@click.option("--max-len", "max_len", type=int, default=None,
              help="Longest prompt + generation. Default: min(2048, the models' position limits).")
@click.option("--dtype", type=click.Choice(DTYPES), default="fp32", show_default=True)
@click.option("--overwrite", is_flag=True, help="Replace an existing pack at the output path.")
@user_errors
def export_command(draft: str, target: str, output: Path, k: int, max_len: int | None, dtype: str, overwrite: bool) -> None:
    """Export a draft/target pair to a speculative-decoding pack."""
    from specpack.export.pipeline import export_pack

    config = ExportConfig(k=k, max_len=max_len, dtype=dtype, overwrite=overwrite)
    export_pack(draft, target, output, config)
    click.echo(str(output))
