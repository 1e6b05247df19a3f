"""`specpack inspect` and `specpack verify`: what a pack holds, and whether its files are intact."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from specpack.cli.errors import user_errors
from specpack.deploy.manifest import Manifest, ModelEntry


@click.command("inspect")
@click.argument("pack", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@user_errors
def inspect_command(pack: Path, as_json: bool) -> None:
    """Show what is in a pack."""
    manifest = Manifest.read(pack)
    if as_json:
        click.echo(json.dumps(asdict(manifest), indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{pack}[/bold]  schema {manifest.schema_version}, specpack {manifest.specpack_version}")
    console.print(f"k_max {manifest.k_max}, max_len {manifest.max_len}, vocab {manifest.vocab_size}, "
                  f"eos ids {manifest.eos_token_ids}, chat template: {'yes' if manifest.has_chat_template else 'no'}, "
                  f"quantization: {manifest.quantization or 'none'}, backends: {', '.join(manifest.backends)}")
    models = Table("model", "source", "type", "layers", "kv heads x dim", "dtype", "graph")
    for role, entry in (("draft", manifest.draft), ("target", manifest.target)):
        models.add_row(role, str(entry.source.get("source", "?")), entry.model_type, str(entry.num_layers),
                       f"{entry.kv_heads} x {entry.head_dim}", entry.dtype, entry.graph.path)
    console.print(models)
    for role, entry in (("draft", manifest.draft), ("target", manifest.target)):
        console.print(_io_table(role, entry))
    files = Table("file", "size", "sha256")
    for f in manifest.files:
        files.add_row(f.path, _size(f.size), f.sha256[:16] + "...")
    console.print(files)


def _io_table(role: str, entry: ModelEntry) -> object:
    from rich.table import Table

    table = Table("", "name", "dtype", "shape", title=f"{role}: {entry.graph.path}")
    specs = [("in", s) for s in entry.graph.inputs] + [("out", s) for s in entry.graph.outputs]
    shown = [(d, s) for d, s in specs if ".key" not in s.name and ".value" not in s.name]
    for direction, spec in shown:
        table.add_row(direction, spec.name, spec.dtype, str(spec.shape))
    table.add_row("", f"+ {len(specs) - len(shown)} KV cache tensors", "", "")
    return table


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


@click.command("verify")
@click.argument("pack", type=click.Path(path_type=Path))
@user_errors
def verify_command(pack: Path) -> None:
    """Check every file of a pack against the sha256 in its manifest."""
    from specpack.deploy.integrity import verify_pack

    manifest = Manifest.read(pack)
    hashed = verify_pack(pack, manifest, full=True)
    click.echo(f"ok: {len(hashed)} files match the manifest ({sum(f.size for f in manifest.files) / 1e6:.1f} MB)")
