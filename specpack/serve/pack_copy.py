"""A pack carried as pieces (Ray's object store: ray_objects.py) and written back as a replica's private copy.

    pack_pieces(PACK, PIN)   manifest.json (checked against PIN), then every file it lists, each in pieces of at
                             most PIECE_BYTES, hashed as read (contract/verified_read.py): what is carried is what the
                             manifest pins, and the sender holds one piece at a time
    materialize(files)       the pieces written into TMPDIR/.specpack-replica-PID-XXXX.partial, renamed to
                             TMPDIR/specpack-replica-PID-XXXX once every file is whole: a partial copy never has the
                             name a pack is loaded from (the caller loads it with specpack.load(copy, manifest_sha256=PIN),
                             which hashes every file again: the arrival is verified as a shared path is)
    remove_copy(copy)        at the replica's shutdown; copies left by a process that died (SIGKILL) are removed by
                             the next materialize on that node

No ray import here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

from specpack.contract.manifest import MANIFEST_FILE, parse_manifest, read_manifest_bytes
from specpack.contract.verified_read import read_verified_chunks
from specpack.errors import SpecpackError

PIECE_BYTES = 64 << 20  # the largest object put per file piece: the sender's and the receiver's memory per file
COPY_PREFIX = "specpack-replica-"
COPY_NAME = re.compile(rf"^\.?{COPY_PREFIX}(\d+)-")


def pack_pieces(pack_dir: Path, pin: str) -> Iterator[tuple[str, Iterator[bytes]]]:
    """(path in the pack, its pieces) for manifest.json and each listed file; SpecpackError on the first file that
    does not match the pinned manifest (raised once its pieces are read: drop what was kept of the pack)."""
    data = read_manifest_bytes(Path(pack_dir), sha256=pin)
    manifest = parse_manifest(data, Path(pack_dir) / MANIFEST_FILE)
    yield MANIFEST_FILE, iter([data])
    for entry in manifest.files:
        yield entry.path, read_verified_chunks(pack_dir, entry, PIECE_BYTES)


def materialize(files: Iterable[tuple[str, Iterable[bytes]]], parent: Path | None = None) -> Path:
    """The files written under a new private directory of `parent` (default: the system's temporary directory),
    renamed to its final name only once all are written; on any error nothing is left behind."""
    parent = Path(parent or tempfile.gettempdir())
    remove_orphans(parent)
    partial = Path(tempfile.mkdtemp(prefix=f".{COPY_PREFIX}{os.getpid()}-", suffix=".partial", dir=parent))
    try:
        for relpath, pieces in files:
            target = partial / _inside(relpath)
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "xb") as f:
                for piece in pieces:
                    f.write(piece)
        final = parent / partial.name.removeprefix(".").removesuffix(".partial")
        os.rename(partial, final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return final


def remove_copy(copy: Path) -> None:
    """A replica's copy, removed (nothing if already gone)."""
    shutil.rmtree(copy, ignore_errors=True)


def remove_orphans(parent: Path) -> None:
    """Copies (whole or partial) whose process is gone on this node: a replica killed before its shutdown ran."""
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            match = COPY_NAME.match(entry.name)
            if match and not _alive(int(match.group(1))):
                shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _inside(relpath: str) -> PurePosixPath:
    """A pack-relative path (the manifest's schema allows no other), checked again before anything is written."""
    path = PurePosixPath(relpath)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise SpecpackError("a pack file's path leaves the pack", expected="a relative path inside the pack",
                            found=repr(relpath)[:120], hint="re-export the pack")
    return path
