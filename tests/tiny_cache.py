"""Tiny models and packs built once per version of the code, shared by the test workers and by later runs.

    store = BuildCache(root)                    root: the pytest cache (.pytest_cache/d/specpack-tiny)
    store.get(("pack", "qwen2", ...), build)    -> a directory that build(dir) filled, built at most once
    plain_graph(store, model_dir, "target.onnx", dtype, form, ...)  -> the entry of that model's plain export (torch),
                                                   keyed by the directory's contents: shared by every pack built from it

Why it is safe to reuse what an earlier run built:
- the key is the sha256 of every file that decides what is built (specpack/**/*.py, tests/tiny.py, this file,
  tests/conftest.py) and of the versions of the libraries that build and write it, plus the build's arguments:
  change any of them and the entry is another one (entries of other code versions are deleted at start);
- an entry is built in a staging directory and renamed into place, under a file lock, so a worker never sees
  half an entry and two workers never build the same one;
- an entry's listing (`<entry>.files.json`, beside it) records the sha256 of each of its files; the first time a
  process hands it out,
  every file is checked against it (a few MB of tiny weights: milliseconds). An entry that a test changed,
  or a file added to it (the integrity stamp `.verified.json` aside), is deleted and built again.

Every build's time and key is appended to `<code>.builds.log` in the cache: docs/testing.md's fixture table.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Hashable
from importlib import metadata
from pathlib import Path

from filelock import FileLock

_ROOT = Path(__file__).resolve().parent.parent
_CODE = [*sorted((_ROOT / "specpack").rglob("*.py")), *(_ROOT / "tests" / name for name in (
    "tiny.py", "tiny_cache.py", "conftest.py"))]
_LIBRARIES = ("torch", "transformers", "tokenizers", "onnx", "onnxscript", "onnxruntime", "numpy", "gguf",
              "onnxruntime-genai", "nvidia-modelopt")
IGNORED = frozenset({".verified.json"})  # the runtime writes its stamp beside a pack's files


def code_key() -> str:
    """sha256 of the code and library versions that decide what a tiny build writes (16 hex digits)."""
    h = hashlib.sha256(sys.version.encode())
    for name in _LIBRARIES:
        try:
            h.update(f"{name}=={metadata.version(name)}\n".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{name} absent\n".encode())
    for path in _CODE:
        h.update(str(path.relative_to(_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _listing(root: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under root but the ignored ones; symlinks are refused."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            raise AssertionError(f"symlink in a cache entry: {path}")
        if path.is_file() and path.name not in IGNORED:
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


class BuildCache:
    """Directories built by a function of their key, once per code version (the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.code = code_key()
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.checked: set[str] = set()  # entries this process has checked
        with FileLock(str(self.root / ".prune.lock")):
            for old in self.root.iterdir():
                if old.name.startswith((self.code, ".prune")):
                    continue
                if old.is_dir():
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    old.unlink(missing_ok=True)

    def get(self, key: tuple[Hashable, ...], build: Callable[[Path], object]) -> Path:
        """The entry for key: checked once per process, built (build(dir) fills dir) if absent or changed."""
        name = f"{self.code}-{hashlib.sha256(repr(key).encode()).hexdigest()[:16]}"
        entry, listing = self.root / name, self.root / f"{name}.files.json"
        if name in self.checked:
            return entry
        with FileLock(str(self.root / f"{name}.lock")):
            if entry.is_dir() and not self._intact(entry, listing):
                shutil.rmtree(entry)
            if not entry.is_dir():
                stage = self.root / f"{self.code}.stage.{os.getpid()}.{time.monotonic_ns()}"
                stage.mkdir()
                try:
                    began = time.perf_counter()
                    build(stage)
                    with (self.root / f"{self.code}.builds.log").open("a") as log:  # where fixture time goes
                        log.write(f"{time.perf_counter() - began:.1f}s {key!r}\n")
                    listing.write_text(json.dumps(_listing(stage)))
                    stage.rename(entry)
                finally:
                    shutil.rmtree(stage, ignore_errors=True)
        self.checked.add(name)
        return entry

    @staticmethod
    def _intact(entry: Path, listing: Path) -> bool:
        try:
            return json.loads(listing.read_text()) == _listing(entry)
        except (OSError, ValueError, AssertionError):
            return False


def _tree_digest(root: Path) -> str:
    """sha256 of every file under root, with its relative path (a tiny model directory: a few MB, milliseconds)."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def plain_graph(store: BuildCache, model_dir: Path, name: str, dtype: str, form: object, taps: tuple[int, ...] = (),
                tree_nodes: int = 0, draft_tree: bool = False) -> Path:
    """The cache entry holding `name` (+ `name.data`): export_plain_graph of model_dir with these arguments, the
    export stage of export_pack (pipeline._export_plain). Keyed by the directory's contents, not its path."""
    from specpack.export.torch_export import export_plain_graph

    def build(root: Path) -> None:
        export_plain_graph(model_dir, root / name, dtype, form, taps, tree_nodes, draft_tree)  # type: ignore[arg-type]

    key = ("plain-graph", _tree_digest(Path(model_dir)), name, dtype, repr(form), tuple(taps), tree_nodes, draft_tree)
    return store.get(key, build)
