"""Check pack files against the manifest before anything is loaded.

A full check hashes every file (seconds per GB). After a full pass, a stamp keyed by each file's size
and mtime lets later loads skip re-hashing files that have not changed since; `specpack verify` always
hashes everything.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from specpack.deploy.manifest import FileEntry, Manifest
from specpack.errors import SpecpackError
from specpack.hashing import sha256_file

STAMP_FILE = ".verified.json"


def verify_pack(pack_dir: Path, manifest: Manifest, *, full: bool = False) -> list[str]:
    """Raise SpecpackError on the first missing, resized or altered file; return the files hashed."""
    stamp = {} if full else _read_stamp(pack_dir)
    hashed: list[str] = []
    fresh: dict[str, list[object]] = {}
    for entry in manifest.files:
        path = pack_dir / entry.path
        _check_present(path, entry)
        st = path.stat()
        key = [st.st_size, st.st_mtime_ns, entry.sha256]
        if stamp.get(entry.path) != key:
            digest = sha256_file(path)
            hashed.append(entry.path)
            if digest != entry.sha256:
                raise SpecpackError(f"pack file {entry.path} does not match the manifest",
                                    expected=f"sha256 {entry.sha256}", found=f"sha256 {digest}",
                                    hint="the file was changed or corrupted: re-export the pack")
        fresh[entry.path] = key
    _write_stamp(pack_dir, fresh)
    return hashed


def _check_present(path: Path, entry: FileEntry) -> None:
    if not path.is_file():
        raise SpecpackError(f"pack file {entry.path} is missing", expected=f"{path} ({entry.size} bytes)",
                            found="no such file", hint="copy the whole pack directory, or re-export it")
    size = path.stat().st_size
    if size != entry.size:
        raise SpecpackError(f"pack file {entry.path} has the wrong size", expected=f"{entry.size} bytes",
                            found=f"{size} bytes", hint="the file is truncated or altered: re-export the pack")


def _read_stamp(pack_dir: Path) -> dict[str, list[object]]:
    try:
        data = json.loads((pack_dir / STAMP_FILE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_stamp(pack_dir: Path, stamp: dict[str, list[object]]) -> None:
    with contextlib.suppress(OSError):  # a read-only pack is fine: the next load hashes again
        (pack_dir / STAMP_FILE).write_text(json.dumps(stamp))
