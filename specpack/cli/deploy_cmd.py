"""`specpack deploy jetson PACK -o BUNDLE`: a self-contained folder that builds the pack's engines on a Jetson."""

from __future__ import annotations

from pathlib import Path

import click

from specpack.cli.errors import user_errors
from specpack.cli.output_paths import OutputPath


@click.group("deploy")
def deploy_command() -> None:
    """Bundles that carry a pack to a device and build its engines there."""


@deploy_command.command("jetson")
@click.argument("pack", type=click.Path(path_type=Path))
@click.option("-o", "--output", "output", type=OutputPath(), required=True, help="The bundle folder (new).")
@click.option("--jetpack", type=click.Choice(["6"]), default="6", show_default=True,
              help="JetPack major version of the device (6: TensorRT 10, CUDA 12, Python 3.10).")
@click.option("--precision", type=click.Choice(["fp16", "int8"]), default="fp16", show_default=True,
              help="What build_engines.sh passes to `specpack build` on the device (Orin has no FP8).")
@click.option("--overwrite", is_flag=True, help="Replace an existing bundle at -o.")
@user_errors
def jetson_command(pack: Path, output: Path, jetpack: str, precision: str, overwrite: bool) -> None:
    """Write BUNDLE: the pack (graphs, tokenizer, manifest), build_engines.sh (verifies, then builds on the
    device), pinned aarch64 requirements, the specpack sources, SHA256SUMS and a README."""
    from specpack.deploy.jetson import JetsonOptions, write_bundle

    bundle = write_bundle(pack, output, JetsonOptions(jetpack=int(jetpack), precision=precision), overwrite=overwrite)
    click.echo(f"bundle written to {bundle}; on the Jetson: bash build_engines.sh (--dry-run prints the commands)")
