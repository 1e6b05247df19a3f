"""The pack manifest: what a pack holds, with hashes and I/O specs. Read by the runtime, written by deploy/."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specpack.errors import SpecpackError

SCHEMA_VERSION = 1
MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: name, element type ("float32", "int64", ...) and shape (ints or symbols)."""

    name: str
    dtype: str
    shape: list[int | str]


@dataclass(frozen=True)
class FileEntry:
    """A file of the pack, relative to the pack root."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class GraphEntry:
    """A graph the runtime loads: its .onnx file, its external data files and its I/O."""

    path: str
    data_files: list[str]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


@dataclass(frozen=True)
class ModelEntry:
    """One of the two models: where it came from and the cache geometry the runtime allocates for."""

    source: dict[str, Any]
    model_type: str
    num_layers: int
    kv_heads: int
    head_dim: int
    vocab_rows: int
    max_positions: int | None
    dtype: str
    graph: GraphEntry


@dataclass(frozen=True)
class Manifest:
    draft: ModelEntry
    target: ModelEntry
    vocab_size: int  # logits width both graphs use
    eos_token_ids: list[int]
    k_max: int
    max_len: int
    tokenizer_files: list[str]
    has_chat_template: bool
    files: list[FileEntry]
    quantization: str | None = None
    backends: list[str] = field(default_factory=lambda: ["onnxruntime"])
    engines: list[dict[str, Any]] = field(default_factory=list)
    specpack_version: str = ""
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def write(self, pack_dir: Path) -> None:
        (pack_dir / MANIFEST_FILE).write_text(self.to_json() + "\n")

    @classmethod
    def read(cls, pack_dir: Path) -> Manifest:
        """Parse `pack_dir/manifest.json`; any problem is a SpecpackError that says what to do."""
        path = pack_dir / MANIFEST_FILE
        if not pack_dir.is_dir():
            raise SpecpackError(f"no pack at {pack_dir}", expected="a pack directory written by spec-export",
                                found="no such directory" if not pack_dir.exists() else "a file")
        if not path.is_file():
            raise SpecpackError(f"{pack_dir} is not a pack", expected=f"{MANIFEST_FILE} in the directory",
                                found="no manifest", hint="export one with `spec-export --draft D --target T -o PACK`")
        try:
            raw = json.loads(path.read_text())
            version = raw.get("schema_version")
            if version != SCHEMA_VERSION:
                raise SpecpackError("unsupported pack schema", expected=f"schema_version {SCHEMA_VERSION}",
                                    found=f"schema_version {version!r}", hint="re-export the pack with this version")
            return _manifest_from_dict(raw)
        except SpecpackError:
            raise
        except (ValueError, KeyError, TypeError) as err:
            raise SpecpackError(f"corrupted manifest {path}", expected="the JSON written by spec-export",
                                found=f"{type(err).__name__}: {err}", hint="re-export the pack") from err

    def file_entry(self, relpath: str) -> FileEntry:
        for entry in self.files:
            if entry.path == relpath:
                return entry
        raise SpecpackError("file not listed in the manifest", expected="a listed file", found=relpath)


def _graph_from_dict(raw: dict[str, Any]) -> GraphEntry:
    return GraphEntry(path=raw["path"], data_files=list(raw["data_files"]),
                      inputs=[TensorSpec(**t) for t in raw["inputs"]], outputs=[TensorSpec(**t) for t in raw["outputs"]])


def _model_from_dict(raw: dict[str, Any]) -> ModelEntry:
    fields = {k: v for k, v in raw.items() if k != "graph"}
    return ModelEntry(**fields, graph=_graph_from_dict(raw["graph"]))


def _manifest_from_dict(raw: dict[str, Any]) -> Manifest:
    fields = {k: v for k, v in raw.items() if k not in ("draft", "target", "files")}
    return Manifest(draft=_model_from_dict(raw["draft"]), target=_model_from_dict(raw["target"]),
                    files=[FileEntry(**f) for f in raw["files"]], **fields)
