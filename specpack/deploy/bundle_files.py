"""What `deploy jetson --overwrite` may delete: exactly the files a bundle lists in its SHA256SUMS, nothing else.

    bundle_refusal(out) -> None when `out` holds only what `deploy jetson` wrote, else why not
    remove_bundle(out)     unlinks the listed files (and what the bundle's own code wrote: bytecode, the pack's
                           stamp), then the folders they leave empty (never a tree)

A directory merely holding files named bundle.json and SHA256SUMS, or a bundle with a file of the user's inside,
is refused: --overwrite never deletes what it did not write.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from pathlib import Path

from specpack.contract.integrity import STAMP_FILE
from specpack.errors import SpecpackError

SUMS, RECORD, PACK_DIR = "SHA256SUMS", "bundle.json", "pack"  # the names deploy/jetson.py writes
RECORD_KEYS = {"specpack_version", "jetpack", "precision", "manifest_sha256"}
SUMS_BYTES_LIMIT = 16 << 20
SHOWN = 5
_LINE = re.compile(r"[0-9a-f]{64}  (?P<path>[^\n]+)")


def bundle_refusal(out: Path) -> str | None:
    """Why `out` is not a bundle that --overwrite may replace, or None."""
    if out.is_symlink() or not out.is_dir():
        return "a symbolic link" if out.is_symlink() else "a file"
    listed = listed_files(out)
    if listed is None:
        return f"a directory whose {SUMS} is not one deploy jetson writes"
    if not _is_record(out / RECORD):
        return f"a directory whose {RECORD} is not one deploy jetson writes"
    present = _entries(out)
    unknown = sorted(p for p in present - listed - {SUMS} if not _derived(p))
    if unknown:
        return f"a bundle holding files it did not write: {', '.join(unknown[:SHOWN])}" + (
            f" (and {len(unknown) - SHOWN} more)" if len(unknown) > SHOWN else "")
    return None


def listed_files(out: Path) -> set[str] | None:
    """The paths SHA256SUMS lists (relative, inside the bundle), or None when it is not a file of ours."""
    try:
        fd = os.open(out / SUMS, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb", closefd=True) as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        data = f.read(SUMS_BYTES_LIMIT + 1)
    try:
        lines = data.decode("utf-8").splitlines() if len(data) <= SUMS_BYTES_LIMIT else [""]
    except UnicodeDecodeError:
        return None
    paths = set()
    for line in lines:
        match = _LINE.fullmatch(line)
        if match is None or match["path"].startswith("/") or {"", ".", ".."} & set(match["path"].split("/")):
            return None
        paths.add(match["path"])
    return paths if RECORD in paths else None


def remove_bundle(out: Path) -> None:
    """Unlink every file SHA256SUMS lists and SHA256SUMS itself, then remove the folders left empty (rmdir: a
    folder that is not empty, because something appeared since the check, stays, and so does its content)."""
    listed = listed_files(out) or set()
    folders: set[Path] = set()
    for rel in [*sorted(listed), SUMS, *sorted(p for p in _entries(out) if _derived(p))]:
        path = out / rel
        path.unlink(missing_ok=True)  # a symlink is unlinked, never followed
        folders.update(p for p in path.relative_to(out).parents if p != Path("."))
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty: files that appeared since the check stay
            (out / folder).rmdir()
    try:
        out.rmdir()
    except OSError:
        raise SpecpackError(f"{out} was not replaced", expected="a bundle holding only its own files",
                            found="files that appeared while it was being replaced (they were kept)",
                            hint="move them away and run deploy jetson again") from None


def _derived(rel: str) -> bool:
    """What running the bundle's own code writes into it: bytecode beside the bundled sources
    (lib/**/__pycache__/*.pyc) and the pack's verified stamp (`specpack verify pack`)."""
    if rel == f"{PACK_DIR}/{STAMP_FILE}":
        return True
    return rel.startswith("lib/") and rel.endswith(".pyc") and rel.split("/")[-2] == "__pycache__"


def _is_record(path: Path) -> bool:
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 16:
            return False
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(record, dict) and record.keys() >= RECORD_KEYS


def _entries(folder: Path) -> set[str]:
    """Every file, symlink and empty folder under `folder`, as relative POSIX paths (links are not followed)."""
    found = set()
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        found |= {(rel / name).as_posix() for name in files + [d for d in dirs if os.path.islink(Path(root, d))]}
        if not dirs and not files and rel != Path("."):
            found.add(rel.as_posix() + "/")
    return found
