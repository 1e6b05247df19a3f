"""`specpack inspect` and `specpack verify`: what a pack holds, and whether its files are intact.

Every string shown comes from an untrusted file: it is rendered as plain text (no rich markup) in the
console's encoding (unencodable characters escaped), after the schema has refused control characters.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from specpack.cli.errors import user_errors
from specpack.contract.manifest import Manifest, ModelEntry, Quantization, parse_manifest, read_manifest_bytes
from specpack.quantize.modes import CALIBRATED
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

    # piped (not a terminal): no width to fit, so paths and hashes are never cut at 80 columns; in a terminal, long
    # cells fold onto more lines instead of ending in an ellipsis
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 10_000)
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
    for column in models.columns:
        column.overflow = "fold"
    console.print(models)
    for role, entry in m.models():
        g = entry.graph
        if g.exporter == "builder":
            console.print(t(f"{role}: graph by onnxruntime-genai's model builder, built for the {g.execution_provider} "
                            f"execution provider; {g.kv_cache} KV cache, {g.attention} attention, positions {g.positions}"))
    for role, entry in m.models():
        console.print(_io_table(role, entry, t))
    for role, entry in m.models():
        for line in quantization_lines(role, entry.quantization):
            console.print(t(line))
    files = Table("file", "size", "sha256")
    for f in m.files:
        files.add_row(t(f.path), t(_size(f.size)), t(f.sha256[:16] + "..."))
    for column in files.columns:
        column.overflow = "fold"
    console.print(files)
    if m.engines:
        engines = Table("engine", "role", "backend", "gpu", "compute capability", "version", "precision")
        for e in m.engines:
            engines.add_row(*map(t, (e.path, e.role, e.backend, e.gpu, e.compute_capability, e.tensorrt_version,
                                     e.precision or "?")))
        console.print(engines)


def _plain_text(encoding: str) -> ToText:
    """str -> rich Text: no markup; characters that are not printable (escape sequences, bidirectional overrides
    from free-form manifest fields) and those the console cannot encode escaped (\\x1b, \\u202e, \\xe9)."""
    from rich.text import Text

    def text(value: str) -> Text:
        return Text(_escaped(value, encoding))

    return text


DIFFERENT_MODEL = ("  a quantized target is a different model: speculative output is lossless with respect to this "
                   "quantized target, not to the original weights")


def quantization_lines(role: str, quantization: Quantization | None) -> list[str]:
    """What `inspect` says about one model's quantization: the method, which weights took which path, fidelity."""
    if quantization is None or quantization.method == "none":
        return [f"{role}: not quantized (the weights as exported)"]
    try:
        return _quantization_details(role, quantization.model_dump(mode="json"))
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):  # free-form details, untrusted
        return [f"{role}: {quantization.method} (its details are not in the form this version writes)",
                *([DIFFERENT_MODEL] if role == "target" else [])]


def _quantization_details(role: str, q: dict[str, Any]) -> list[str]:
    if q["method"] in CALIBRATED:
        cal = q["calibration"]
        lines = [f"{role}: {q['method']} Q/DQ of weights and activations ({q['summary']['weight_matmuls']} MatMuls), "
                 f"calibrated on {cal['samples']} samples ({cal['method']}; dataset sha256 {cal['dataset_sha256'][:12]}, "
                 + ", ".join(f"{lib} {v}" for lib, v in cal["versions"].items()) + ")"]
    else:
        level = q.get("accuracy_level")
        kernels = f"accuracy level {level}" if level is not None else "the execution provider's kernels"
        by = f", by {q['quantizer']}" if q.get("quantizer") else ""
        lines = [f"{role}: {q['method']} weight-only (MatMulNBits, {kernels}{by}), "
                 f"{_size(q['bytes_before'])} -> {_size(q['bytes_after'])} of weights; "
                 + ", ".join(f"{n} {path}" for path, n in q["summary"].items())]
    kept = [t for t in q["tensors"] if "why" in t]
    for t in kept[:8]:
        lines.append(f"  {t.get('gguf_tensor', t['tensor'])}: {t['path']}, {t['why']}")
    if len(kept) > 8:
        lines.append(f"  ... {len(kept) - 8} more (inspect --json lists every tensor)")
    fid = q.get("fidelity") or {}
    if role == "target":
        if fid.get("top1_agreement") is not None:
            lines.append(f"  fidelity: top-1 agreement {fid['top1_agreement']:.4f}, mean KL {fid['mean_kl']:.2e} "
                         f"vs the unquantized target ({fid['positions']} positions)")
        lines.append(DIFFERENT_MODEL)
    elif fid.get("by_k"):
        cells = [f"k={k}: alpha {r['quantized']['alpha']:.3f} vs {r['reference']['alpha']:.3f} unquantized"
                 for k, r in fid["by_k"].items() if r["quantized"]["alpha"] is not None and r["reference"]["alpha"] is not None]
        lines.append("  fidelity (greedy replay): " + "; ".join(cells))
    return lines


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
    from specpack.contract.integrity import extra_files, verify_pack

    manifest, digest = read_pinned(pack, manifest_sha256)
    hashed = verify_pack(pack, manifest, full=True)
    extra = extra_files(pack, manifest)
    click.echo(f"ok: {len(hashed)} files match the manifest ({sum(f.size for f in manifest.files) / 1e6:.1f} MB); "
               f"manifest sha256 {digest}")
    if extra:
        shown = ", ".join(_escaped(name) for name in extra[:10]) + (f" (and {len(extra) - 10} more)" if len(extra) > 10 else "")
        click.echo(f"note: {len(extra)} files in the pack are not in the manifest (never loaded): {shown}")


def _escaped(text: str, encoding: str = "ascii") -> str:
    """Text from an untrusted file, safe for a terminal: every character that is not printable (controls, escape
    sequences, bidirectional overrides, separators) or not encodable in `encoding` as a backslash escape."""
    out = []
    for c in text:
        try:
            c.encode(encoding)
            ok = c.isprintable()
        except UnicodeEncodeError:
            ok = False
        out.append(c if ok else c.encode("unicode_escape").decode("ascii"))
    return "".join(out)
