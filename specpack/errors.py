"""One error type for everything a user can get wrong: it says what was expected, what was found, what to do."""

from __future__ import annotations

import errno
import os

# errno -> (what the environment did, what to do about it); the OS failures a user can fix
_OS_ERRORS = {
    errno.ENOSPC: ("no space left on the device", "free some space, or write somewhere else"),
    errno.EDQUOT: ("the disk quota is exceeded", "free some space, or write somewhere else"),
    errno.EROFS: ("a read-only file system", "write to a writable location"),
    errno.EACCES: ("permission denied", "write to a location you own, or fix its permissions"),
    errno.EPERM: ("operation not permitted", "write to a location you own, or fix its permissions"),
    errno.ENOTDIR: ("a part of the path is a file, not a directory", "check the path"),
    errno.EEXIST: ("the path already exists", "choose another path"),
    errno.ENAMETOOLONG: ("the file name is too long", "choose a shorter path"),
}


class SpecpackError(Exception):
    """A user-facing error. The CLI prints it without a traceback and exits with status 2."""

    def __init__(self, what: str, *, expected: str | None = None, found: str | None = None, hint: str | None = None):
        self.what, self.expected, self.found, self.hint = what, expected, found, hint
        lines = [what]
        if expected is not None:
            lines.append(f"  expected: {expected}")
        if found is not None:
            lines.append(f"  found:    {found}")
        if hint is not None:
            lines.append(f"  hint:     {hint}")
        super().__init__("\n".join(lines))


def os_error(err: OSError, action: str, where: str | os.PathLike[str] | None = None) -> SpecpackError | None:
    """A SpecpackError for an OS failure a user can fix (disk full, read-only, permissions), else None.

    `action` says what was being done ("writing the pack"), `where` the path it was done at.
    """
    known = _OS_ERRORS.get(err.errno or -1)
    if known is None:
        return None
    found, hint = known
    place = f" at {where}" if where is not None else ""
    return SpecpackError(f"{action} failed{place}: {found}", expected=f"a writable location with room for {action}"
                         if err.errno != errno.ENOTDIR else "a path whose parents are directories",
                         found=f"{found} ({os.strerror(err.errno or 0)})", hint=hint)
