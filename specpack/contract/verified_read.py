"""Pack files read once into memory and hashed as they are read: what a pinned load hands to its consumers.

    read_verified(pack_dir, entry) -> bytes         the file's bytes, refused unless they hash to entry.sha256
    read_verified_chunks(pack_dir, entry, n) -> Iterator[bytes]   the same in pieces of at most n bytes (a copy's)
    graph_bytes(pack_dir, manifest, graph) -> GraphBytes   a graph and its external data files, each verified

With a pinned manifest (`manifest_sha256=`), ONNX Runtime, the tokenizer and TensorRT get these bytes, never a
path: whatever happens to the files after (or while) they are checked, the bytes that run are the bytes that
were hashed. ONNX Runtime copies the external data it is given (measured: a buffer changed after the session
was created does not change its results), so the bytes can be dropped once a session exists.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from specpack.contract.manifest import FileEntry, GraphEntry, Manifest
from specpack.errors import SpecpackError


@dataclass(frozen=True)
class GraphBytes:
    """A graph's bytes and its external data files by the name the graph gives them (relative to its folder)."""

    name: str                                                 # the graph's path in the pack, for messages
    model: bytes
    external: dict[str, bytes] = field(default_factory=dict)  # location named in the graph -> the file's bytes


def read_verified(pack_dir: Path, entry: FileEntry) -> bytes:
    """The bytes of a listed file, read once; SpecpackError unless they are exactly entry.size bytes hashing to
    entry.sha256. The path is resolved and kept inside the pack first (as verify_pack does)."""
    with _open_listed(pack_dir, entry) as f:
        data = f.read(entry.size + 1)  # one buffer; a file that grew is caught by its length
    _check(entry, len(data), hashlib.sha256(data).hexdigest())
    return data


def read_verified_chunks(pack_dir: Path, entry: FileEntry, chunk_bytes: int) -> Iterator[bytes]:
    """A listed file in pieces of at most chunk_bytes, hashed as they are read: memory for one piece, not the file.
    SpecpackError (as read_verified's) after the last piece unless the whole is entry.size bytes hashing to
    entry.sha256: a consumer keeps nothing of the file until the iterator is exhausted."""
    digest, size = hashlib.sha256(), 0
    with _open_listed(pack_dir, entry) as f:
        while size <= entry.size and (piece := f.read(min(chunk_bytes, entry.size + 1 - size))):
            digest.update(piece)
            size += len(piece)
            yield piece
    _check(entry, size, digest.hexdigest())


def _open_listed(pack_dir: Path, entry: FileEntry) -> BinaryIO:
    """The listed file opened for reading: resolved inside the pack, a regular file (no FIFO to hang on)."""
    root = Path(pack_dir).resolve()
    try:
        real = (root / entry.path).resolve()
    except (OSError, RuntimeError):
        real = None
    if real is None or not real.is_relative_to(root):
        raise SpecpackError(f"pack file {entry.path} resolves outside the pack", expected="a file inside the pack",
                            found="a symlink loop or a link leaving the pack", hint="re-export the pack")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise SpecpackError(f"pack file {entry.path} cannot be read", expected="a readable file of the pack",
                            found=err.strerror or str(err), hint="copy the whole pack directory, or re-export it"
                            ) from None
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        raise SpecpackError(f"pack file {entry.path} is not a regular file", expected="a regular file",
                            found="a directory or special file", hint="re-export the pack")
    return f


def _check(entry: FileEntry, size: int, digest: str) -> None:
    if size != entry.size or digest != entry.sha256:
        raise SpecpackError(f"pack file {entry.path} does not match the pinned manifest",
                            expected=f"{entry.size} bytes, sha256 {entry.sha256}",
                            found=f"{size} bytes" if size != entry.size else f"sha256 {digest}",
                            hint="the file was changed after the pack was deployed: deploy it again")


def graph_bytes(pack_dir: Path, manifest: Manifest, graph: GraphEntry) -> GraphBytes:
    """The graph file and every external data file it names, each read and verified once. `data_files` are the
    locations as the graph writes them; the manifest lists them under the same names (Manifest.loaded_files)."""
    external = {data: read_verified(pack_dir, manifest.file_entry(data)) for data in graph.data_files}
    return GraphBytes(graph.path, read_verified(pack_dir, manifest.file_entry(graph.path)), external)

