"""`--pack-delivery object-store`: the pack put into Ray's object store once by the driver, copied out by each replica.

    driver   put_pack(PACK, PIN) -> ShippedPack: manifest.json and every listed file, verified as read against PIN
             (pack_copy.pack_pieces), one object per piece of at most pack_copy.PIECE_BYTES
    replica  fetch_pack(shipped) -> a private local directory (pack_copy.materialize: one piece in memory at a time,
             renamed into place once whole), then specpack.load(copy, manifest_sha256=PIN) as from a shared path

The objects are owned by the driver (`specpack serve --ray`): they stay in the object store while it runs, so a
replica that starts later (a replacement, autoscaling) copies them again; they go when it exits. This module imports
ray: only the Ray host modules import it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.exceptions import RayError

from specpack.errors import SpecpackError
from specpack.serve.pack_copy import materialize, pack_pieces


@dataclass(frozen=True)
class ShippedFile:
    path: str                       # in the pack (the manifest's name)
    size: int
    pieces: tuple[ray.ObjectRef, ...]


@dataclass(frozen=True)
class ShippedPack:
    """What each replica gets instead of a path: the pin and the objects of every file."""

    pin: str
    files: tuple[ShippedFile, ...]
    put_s: float = 0.0

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def describe(self) -> str:
        pieces = sum(len(f.pieces) for f in self.files)
        return (f"{len(self.files)} files, {self.size / 2**20:.1f} MiB in {pieces} objects, put in "
                f"{self.put_s:.1f} s")


def put_pack(pack_dir: Path, pin: str) -> ShippedPack:
    """The pack's manifest and listed files in the object store, each piece verified as read; SpecpackError (and
    nothing kept) if any file does not match the pinned manifest."""
    start, files = time.monotonic(), []
    for path, pieces in pack_pieces(pack_dir, pin):
        refs, size = [], 0
        for piece in pieces:  # put, then dropped: the reader holds at most the next one besides
            refs.append(ray.put(piece))
            size += len(piece)
            del piece
        files.append(ShippedFile(path, size, tuple(refs)))
    return ShippedPack(pin, tuple(files), time.monotonic() - start)


def fetch_pack(shipped: ShippedPack, parent: Path | None = None) -> Path:
    """The shipped files copied into a new private directory (pack_copy.materialize); SpecpackError if an object
    cannot be fetched (its owner, the driver, gone)."""
    try:
        return materialize(((f.path, (ray.get(ref) for ref in f.pieces)) for f in shipped.files), parent)
    except RayError as err:
        raise SpecpackError("the pack's objects cannot be fetched from Ray's object store",
                            expected="the objects put by `specpack serve --ray --pack-delivery object-store` "
                                     "(they live while that process runs)",
                            found=f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}",
                            hint="deploy again from a running `specpack serve --ray`") from None
