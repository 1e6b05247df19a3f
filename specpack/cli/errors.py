"""Every command's failures: a SpecpackError (or a disk-full / read-only / permission OSError) becomes a message and
exit status 2, an interrupt exit status 130, never a traceback unless `--debug` or SPECPACK_DEBUG=1 asks for one."""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import click

from specpack.errors import SpecpackError, os_error

F = TypeVar("F", bound=Callable[..., Any])
DEBUG_ENV = "SPECPACK_DEBUG"


def debug_enabled() -> bool:
    """--debug on this command (or the group), or SPECPACK_DEBUG set to anything but 0."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(DEBUG_ENV)) or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _enable_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[DEBUG_ENV] = True  # meta is shared by the group's and the command's contexts


debug_option = click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_enable_debug,
                            help=f"Show a traceback with errors (or set {DEBUG_ENV}=1).")


def user_errors(fn: F) -> F:
    """Wrap a click command's function (put it right above `def`); also adds the command's --debug option."""

    @debug_option
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SpecpackError as err:
            _fail(err, err)
        except OSError as err:
            translated = os_error(err, "the command", err.filename)
            if translated is None:
                raise
            _fail(translated, err)
        except KeyboardInterrupt as err:
            _fail("interrupted", err, status=130)

    return wrapper  # type: ignore[return-value]


def _fail(message: object, err: BaseException, status: int = 2) -> None:
    if debug_enabled():
        traceback.print_exception(err, file=sys.stderr)
    click.echo(f"error: {message}", err=True)
    sys.exit(status)
