"""Turn SpecpackError into a clean message and exit status 2, for every command."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from specpack.errors import SpecpackError

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SpecpackError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]
