"""Check pack files against the manifest before anything is loaded. It cannot be switched off:

    1. every path is resolved (symlinks included) and must stay inside the pack: refused before any is opened
    2. every listed file must be a regular file of the listed size
    3. every listed file is hashed (sha256) and compared, unless the fast path below vouches for it

The manifest schema already refuses a manifest that leaves a file the runtime opens unlisted
(`Manifest.loaded_files`), so 1-3 cover every graph, external-data file, tokenizer file and engine.

Fast path: after a full pass, `.verified.json` records each file's (device, inode, size, mtime_ns,
ctime_ns, sha256). A later load re-hashes any file whose record differs. `touch -r` can restore an
mtime but not a ctime, and a copy gets a new inode, so edits, copies and corruption are caught. It does
not protect against an attacker who can write the pack (they can rewrite the stamp too): pin the
manifest's sha256 for that (`specpack.load(path, manifest_sha256=...)`): a pinned load never reads the stamp,
hashes every file, and hands the runtime the bytes it hashed (contract/verified_read.py). `specpack verify`
always hashes.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Collection
from pathlib import Path

from specpack.contract.manifest import MANIFEST_FILE, FileEntry, Manifest
from specpack.errors import SpecpackError
from specpack.hashing import sha256_file

STAMP_FILE = ".verified.json"
STAMP_BYTES_LIMIT = 4 << 20
SHOWN = 10  # extra files named by `specpack verify`


def verify_pack(pack_dir: Path, manifest: Manifest, *, full: bool = False,
                deferred: Collection[str] = ()) -> list[str]:
    """Raise SpecpackError on the first escaping, missing, resized or altered file; return the files hashed.

    full: never trust the stamp (`specpack verify`, and every load with a pinned digest). deferred: files whose
    hash the caller checks on the bytes it reads (contract/verified_read.py): here only placed and sized, and
    left out of the stamp."""
    paths = resolve_files(pack_dir, manifest)
    stamp = {} if full else _read_stamp(pack_dir)
    hashed: list[str] = []
    fresh: dict[str, list[object]] = {}
    for entry in manifest.files:
        path = paths[entry.path]
        key = stamp_key(path, entry)
        if entry.path in deferred:
            continue
        if stamp.get(entry.path) != key:
            digest = sha256_file(path)
            hashed.append(entry.path)
            if digest != entry.sha256:
                raise SpecpackError(f"pack file {entry.path} does not match the manifest",
                                    expected=f"sha256 {entry.sha256}", found=f"sha256 {digest}",
                                    hint="the file was changed or corrupted: re-export the pack")
        fresh[entry.path] = key
    if not deferred:  # a partial stamp would only make the next unpinned load hash again
        _write_stamp(pack_dir, fresh)
    return hashed


def resolve_files(pack_dir: Path, manifest: Manifest) -> dict[str, Path]:
    """Each listed path, resolved; SpecpackError if any leaves the pack (through `..` or a symlink).

    Nothing is opened: a refused path's size, content or hash never reaches a message.
    """
    root = Path(pack_dir).resolve()
    out = {}
    for entry in manifest.files:
        try:
            real = (root / entry.path).resolve()
        except (OSError, RuntimeError):  # a symlink loop
            real = None
        if real is None or not real.is_relative_to(root):
            raise SpecpackError(f"pack file {entry.path} resolves outside the pack", expected="a file inside the pack",
                                found="a symlink loop" if real is None else "a symlink to a path outside the pack",
                                hint="copy the pack with its files, not links to them (cp -rL), or re-export it")
        out[entry.path] = real
    return out


def stamp_key(path: Path, entry: FileEntry) -> list[object]:
    """What the fast path compares: the file's identity, size and times, and the hash it must have."""
    st = _check_present(path, entry)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, entry.sha256]


def extra_files(pack_dir: Path, manifest: Manifest) -> list[str]:
    """Files in the pack that the manifest does not list (never loaded; reported by `specpack verify`)."""
    listed = {f.path for f in manifest.files} | {MANIFEST_FILE, STAMP_FILE}
    found = []
    for folder, dirs, files in os.walk(pack_dir):  # symlinks to folders are not followed: they count as files
        rel = Path(folder).relative_to(pack_dir)
        found += [(rel / name).as_posix() for name in files + [d for d in dirs if os.path.islink(Path(folder, d))]]
    return sorted(p for p in found if p not in listed)


def _check_present(path: Path, entry: FileEntry) -> os.stat_result:
    try:
        st = os.stat(path)
    except OSError:
        raise SpecpackError(f"pack file {entry.path} is missing", expected=f"{entry.path} ({entry.size} bytes)",
                            found="no such file", hint="copy the whole pack directory, or re-export it") from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO or device would hang or never end the hashing
        raise SpecpackError(f"pack file {entry.path} is not a regular file", expected="a regular file",
                            found="a directory" if stat.S_ISDIR(st.st_mode) else "a special file (FIFO, device, socket)",
                            hint="re-export the pack")
    if st.st_size != entry.size:
        raise SpecpackError(f"pack file {entry.path} has the wrong size", expected=f"{entry.size} bytes",
                            found=f"{st.st_size} bytes", hint="the file is truncated or altered: re-export the pack")
    return st


def _read_stamp(pack_dir: Path) -> dict[str, list[object]]:
    """The stamp, or {} when it is missing, a link, a special file, too large or not a JSON object."""
    try:
        fd = os.open(Path(pack_dir) / STAMP_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a directory: os.fdopen would raise IsADirectoryError
        os.close(fd)
        return {}
    with os.fdopen(fd, "rb") as f:
        try:
            data = json.loads(f.read(STAMP_BYTES_LIMIT + 1))
        except (OSError, ValueError, RecursionError):
            return {}
    return data if isinstance(data, dict) else {}


def _write_stamp(pack_dir: Path, stamp: dict[str, list[object]]) -> None:
    """Written beside and renamed over: a symlink planted at the stamp's name is replaced, never written through."""
    with contextlib.suppress(OSError):  # a read-only pack is fine: the next load hashes again
        fd, tmp = tempfile.mkstemp(prefix=f"{STAMP_FILE}.", dir=pack_dir)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(stamp, f)
            os.replace(tmp, Path(pack_dir) / STAMP_FILE)
        except OSError:
            Path(tmp).unlink(missing_ok=True)
            raise
