"""`specpack inspect` and `specpack verify`: what a pack holds, and whether its files are intact.

Every string shown comes from an untrusted file: it is rendered as plain text (no rich markup) in the
console's encoding (unencodable characters escaped), after the schema has refused control characters.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from specpack.cli.errors import user_errors
from specpack.deploy.manifest import Manifest, ModelEntry, parse_manifest, read_manifest_bytes
from specpack.validation import check_sha256

if TYPE_CHECKING:
    from rich.table import Table
    from rich.text import Text

    ToText = Callable[[str], Text]

PIN_HELP = "Refuse the pack unless its manifest.json has this sha256 (printed by `specpack inspect`)."


def read_pinned(pack: Path, manifest_sha256: str | None) -> tuple[Manifest, str]:
    """The pack's manifest and its sha256, refused when it differs from `manifest_sha256`."""
    if manifest_sha256 is not None:
        manifest_sha256 = check_sha256(manifest_sha256, "--manifest-sha256")
    data = read_manifest_bytes(pack, sha256=manifest_sha256)
    return parse_manifest(data, pack / "manifest.json"), hashlib.sha256(data).hexdigest()


@click.command("inspect")
@click.argument("pack", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print {manifest_sha256, manifest} as one JSON object.")
@user_errors
def inspect_command(pack: Path, as_json: bool) -> None:
    """Show what is in a pack, and the sha256 of its manifest (to pin it)."""
    manifest, digest = read_pinned(pack, None)
    if as_json:
        click.echo(json.dumps({"manifest_sha256": digest, "manifest": json.loads(manifest.to_json())}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    t = _plain_text(console.encoding)
    m = manifest
    console.print(t(f"{pack}  schema {m.schema_version}, specpack {m.specpack_version or '?'}"))
    console.print(t(f"manifest sha256 {digest}  (pin it: specpack.load(PACK, manifest_sha256=...), "
                    "--manifest-sha256)"))
    console.print(t(f"k_max {m.k_max}, max_len {m.max_len}, vocab {m.vocab_size}, eos ids {m.eos_token_ids}, "
                    f"chat template: {'yes' if m.has_chat_template else 'no'}, drafter: {m.drafter}, "
                    f"backends: {', '.join(m.backends)}"))
    models = Table("model", "source", "type", "layers", "kv heads x dim", "dtype", "quantization", "graph")
    for role, entry in m.models():
        quant = entry.quantization.method if entry.quantization is not None else "none"
        models.add_row(*map(t, (role, entry.source.source, entry.model_type, str(entry.num_layers),
                                f"{entry.kv_heads} x {entry.head_dim}", entry.dtype, quant, entry.graph.path)))
    console.print(models)
    for role, entry in m.models():
        console.print(_io_table(role, entry, t))
    files = Table("file", "size", "sha256")
    for f in m.files:
        files.add_row(t(f.path), t(_size(f.size)), t(f.sha256[:16] + "..."))
    console.print(files)
    if m.engines:
        engines = Table("engine", "role", "backend", "gpu", "compute capability", "version")
        for e in m.engines:
            engines.add_row(*map(t, (e.path, e.role, e.backend, e.gpu, e.compute_capability, e.tensorrt_version)))
        console.print(engines)


def _plain_text(encoding: str) -> ToText:
    """str -> rich Text: no markup, characters the console cannot encode escaped (\\xe9, \\u2028)."""
    from rich.text import Text

    def text(value: str) -> Text:
        return Text(value.encode(encoding, "backslashreplace").decode(encoding, "replace"))

    return text


def _io_table(role: str, entry: ModelEntry, t: ToText) -> Table:
    from rich.table import Table

    table = Table("", "name", "dtype", "shape", title=t(f"{role}: {entry.graph.path}"))
    specs = [("in", s) for s in entry.graph.inputs] + [("out", s) for s in entry.graph.outputs]
    shown = [(d, s) for d, s in specs if ".key" not in s.name and ".value" not in s.name]
    for direction, spec in shown:
        table.add_row(t(direction), t(spec.name), t(spec.dtype), t(str(spec.shape)))
    table.add_row("", t(f"+ {len(specs) - len(shown)} KV cache tensors ({entry.graph.kv_cache})"), "", "")
    return table


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)


@click.command("verify")
@click.argument("pack", type=click.Path(path_type=Path))
@click.option("--manifest-sha256", default=None, help=PIN_HELP)
@user_errors
def verify_command(pack: Path, manifest_sha256: str | None) -> None:
    """Check every file of a pack against the sha256 in its manifest; list files the manifest does not know."""
    from specpack.deploy.integrity import extra_files, verify_pack

    manifest, digest = read_pinned(pack, manifest_sha256)
    hashed = verify_pack(pack, manifest, full=True)
    extra = extra_files(pack, manifest)
    click.echo(f"ok: {len(hashed)} files match the manifest ({sum(f.size for f in manifest.files) / 1e6:.1f} MB); "
               f"manifest sha256 {digest}")
    if extra:
        shown = ", ".join(_escaped(name) for name in extra[:10]) + (f" (and {len(extra) - 10} more)" if len(extra) > 10 else "")
        click.echo(f"note: {len(extra)} files in the pack are not in the manifest (never loaded): {shown}")


def _escaped(name: str) -> str:
    """A file name as printable ASCII (a name can hold terminal control sequences)."""
    return "".join(c if c.isprintable() and c.isascii() else c.encode("unicode_escape").decode() for c in name)
