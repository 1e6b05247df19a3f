"""Output paths, checked when the command starts: never after the work they would hold was done.

    OutputPath()                                   a click path type that refuses "" (click would read it as ".")
    check_output_file(path, option, overwrite=, suffixes=)   a file that can be written, or a SpecpackError
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from specpack.errors import SpecpackError
from specpack.export.staging import check_writable


class OutputPath(click.Path):
    """click.Path(path_type=Path) that refuses an empty string instead of reading it as the current directory."""

    def __init__(self) -> None:
        super().__init__(path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path: give the name of a new file or folder", param, ctx)
        return super().convert(value, param, ctx)


def check_output_file(path: Path, option: str, *, overwrite: bool = False,
                      suffixes: tuple[str, ...] | None = None) -> None:
    """`path` can be written as a file: a known suffix, not a directory, not an existing file unless `overwrite`,
    in a writable directory (not under a file)."""
    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise SpecpackError(f"{option} {path}: unknown file type", expected=f"a file name ending in "
                            f"{' or '.join(suffixes)}", found=repr(path.suffix or "no suffix"),
                            hint=f"e.g. {option} report{suffixes[0]}")
    if path.is_dir():
        raise SpecpackError(f"{option} {path} is a directory", expected="the path of a file to write",
                            found="a directory", hint=f"e.g. {option} {path / ('report' + (suffixes or ('.json',))[0])}")
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise SpecpackError(f"{option} {path} already exists", expected="a new file", found="an existing file",
                            hint="choose another name, or pass --overwrite to replace it")
    check_writable(path)
