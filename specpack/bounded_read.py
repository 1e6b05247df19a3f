"""Reading user files with a size limit: never more than `limit` bytes into memory, decompressed or not.

    read_bounded(path, limit, what) -> bytes       at most `limit` bytes (/dev/zero, a FIFO: refused at the limit)
    gunzip_bounded(data, limit, what) -> bytes     gzip members decompressed up to `limit` bytes (a bomb: refused)
"""

from __future__ import annotations

import zlib
from pathlib import Path

from specpack.errors import SpecpackError

GZIP_MAGIC = b"\x1f\x8b"


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The file's bytes; SpecpackError for a file past `limit` bytes (read up to limit + 1, never further) or one
    that cannot be read."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as err:
        raise SpecpackError(f"cannot read {what} {path}", expected="a readable file",
                            found=err.strerror or str(err)) from None
    if len(data) > limit:
        raise SpecpackError(f"{what} {path} is too large", expected=f"at most {limit:,} bytes",
                            found=f"more than {limit:,} bytes", hint="shorten it, or split it into several files")
    return data


def gunzip_bounded(data: bytes, limit: int, what: str) -> bytes:
    """Every gzip member of `data`, decompressed; SpecpackError past `limit` bytes of output or for corrupt data."""
    out: list[bytes] = []
    size, rest = 0, data
    try:
        while rest:
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)  # one gzip member
            pending = rest
            while not inflate.eof:
                chunk = inflate.decompress(pending, limit + 1 - size)  # never more than one byte past the limit
                if not chunk and inflate.unconsumed_tail == pending:
                    raise zlib.error("the compressed data ends early (truncated)")
                pending = inflate.unconsumed_tail
                size += len(chunk)
                out.append(chunk)
                if size > limit:
                    raise SpecpackError(f"{what} is too large once decompressed",
                                        expected=f"at most {limit:,} bytes of text",
                                        found=f"more than {limit:,} bytes", hint="split it into several files")
            rest = inflate.unused_data
            if not rest.startswith(GZIP_MAGIC):
                break  # no further member: trailing padding is ignored, as gzip does
    except zlib.error as err:
        raise SpecpackError(f"{what} is not valid gzip data", expected="a complete gzip file",
                            found=str(err)[:200], hint="download or compress it again") from None
    return b"".join(out)
