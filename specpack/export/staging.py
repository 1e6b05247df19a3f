"""Exports never lose data: where a pack is written, how it replaces an old one, and what an interrupt cleans.

    check_destination(out, overwrite)  an existing -o must be a pack (or an empty folder) to be replaced
    stop_on_signals()                  SIGTERM / SIGHUP raise SystemExit, so clean-up runs (SIGINT already does)
    run_isolated(fn, *args)            fn in a fresh process; the process is stopped if this one is interrupted
    run_isolated_all([(fn, args), ..]) several at once, each in its own process; the first failure stops the rest
    staging_dir(out)                   .NAME.partial-PID-HOST-xxxx beside `out`, removed on any failure;
                                       disk-full and read-only failures become SpecpackErrors that say so
    publish(staging, out)              checks `out` again, then renames the staging directory into place
    remove_stale(folder, base)         temp dirs of killed runs on this host (their process is gone)

Temp names carry the pid and a host tag, so a later run removes only what a dead process on this host left.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import secrets
import shutil
import signal
import socket
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, TypeVar, cast

from specpack.errors import SpecpackError, os_error

T = TypeVar("T")
DISK_FULL_BYTES = 16 << 20  # a failure with less free space than this is reported as a full disk
PACK_FILES = {"manifest.json", ".verified.json"}
SHOWN = 5


def host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def temp_prefix(base: str) -> str:
    """`base` + "PID-HOST-": the prefix of a temp dir that remove_stale can attribute to its process."""
    return f"{base}{os.getpid()}-{host_tag()}-"


def remove_stale(folder: Path, base: str) -> list[Path]:
    """Remove `folder/base*` temp dirs whose process (on this host) is gone; return them."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in Path(folder).iterdir():
            if not entry.name.startswith(base) or not entry.is_dir() or entry.is_symlink():
                continue
            pid, _, rest = entry.name[len(base):].partition("-")
            if pid.isdigit() and rest.startswith(host_tag() + "-") and not _alive(int(pid)):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def check_destination(out: Path, overwrite: bool) -> None:
    """Refuse an existing `out` unless --overwrite is given and `out` is a pack (only its own files) or empty;
    refuse a place the pack cannot be written to (under a file, a read-only file system), before any work."""
    check_writable(out)
    if not out.exists() and not out.is_symlink():
        return
    if not overwrite:
        raise SpecpackError(f"{out} already exists", expected="a new output path", found="an existing path",
                            hint="choose another -o, or pass --overwrite to replace a pack")
    refusal = _not_a_pack(out)
    if refusal is not None:
        raise SpecpackError(f"--overwrite replaces only a pack, and {out} is not one", expected="a pack directory "
                            "(manifest.json and the files it lists) or an empty directory", found=refusal,
                            hint="choose another -o, or move the directory away yourself")


def check_writable(out: Path) -> None:
    """The nearest existing parent of `out` is a directory this process can write on a writable file system."""
    parent = out.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    found = None
    if not parent.is_dir():
        found = f"{parent} is a file, not a directory"
    elif os.statvfs(parent).f_flag & os.ST_RDONLY:
        found = f"{parent} is on a read-only file system"
    elif not os.access(parent, os.W_OK | os.X_OK):
        found = f"{parent} is not writable by this user (permission denied)"
    if found is not None:
        raise SpecpackError(f"cannot write {out}", expected="a path in a writable directory", found=found,
                            hint="choose another path")


def _not_a_pack(out: Path) -> str | None:
    """Why `out` must not be replaced, or None when it is a pack or an empty directory."""
    if out.is_symlink():
        return "a symbolic link"
    if not out.is_dir():
        return "a file"
    present = _files_under(out)
    if not present:
        return None
    if "manifest.json" not in present:
        return f"a directory without manifest.json, holding {_list(sorted(present))}"
    try:
        from specpack.contract.manifest import parse_json

        raw = parse_json((out / "manifest.json").read_bytes()[: 16 << 20], out / "manifest.json")
        listed = {f["path"] for f in raw["files"] if isinstance(f, dict) and isinstance(f.get("path"), str)}
    except (SpecpackError, OSError, KeyError, TypeError):
        return "a directory whose manifest.json cannot be read"
    unknown = sorted(p for p in present - listed - PACK_FILES if not p.startswith(".verified.json."))
    return f"a pack holding files its manifest does not list: {_list(unknown)}" if unknown else None


def _files_under(folder: Path) -> set[str]:
    found = set()
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        found |= {(rel / name).as_posix() for name in files + [d for d in dirs if os.path.islink(Path(root, d))]}
    return found


def _list(items: list[str]) -> str:
    return ", ".join(items[:SHOWN]) + (f" (and {len(items) - SHOWN} more)" if len(items) > SHOWN else "")


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise SystemExit(128 + signal) in the main thread, so `finally` and `except` clean up."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_isolated(fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` in a fresh (spawned) process, whose memory is returned when it ends.

    Its exception (SpecpackError included) is raised here; if it dies (the OOM killer) that is a SpecpackError;
    if this process is interrupted, the child is stopped before the interrupt goes on.
    """
    result: T = run_isolated_all([(fn, args)])[0]
    return result


def run_isolated_all(calls: Sequence[tuple[Callable[..., Any], tuple[object, ...]]]) -> list[Any]:
    """Each `fn(*args)` of `calls` in a fresh process of its own, all running at once (started from this thread);
    their results in order. The first error or death to come stops the others and is raised, as run_isolated
    raises it; an interrupt stops them all."""
    ctx = multiprocessing.get_context("spawn")
    workers: list[tuple[Callable[..., Any], Any, Connection, Connection]] = []
    try:  # from start() on: an interrupt that lands while a child is being launched stops it too
        for fn, args in calls:
            receive, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(send, fn, args, os.getpid()), daemon=True)
            workers.append((fn, proc, receive, send))
            proc.start()
            send.close()
        results: list[Any] = [None] * len(workers)
        pending = {receive: i for i, (_, _, receive, _) in enumerate(workers)}
        while pending:
            for ready in wait(list(pending)):
                conn = cast(Connection, ready)
                i = pending.pop(conn)
                fn, proc = workers[i][:2]
                try:
                    ok, value, remote_tb = conn.recv()
                except EOFError:  # the child ended without a word
                    proc.join()
                    raise _died(fn, proc.exitcode) from None
                proc.join(30)  # it is exiting
                if not ok:
                    if remote_tb and hasattr(value, "add_note") and not isinstance(value, SpecpackError):
                        value.add_note(f"in the worker process:\n{remote_tb}")
                    raise value
                results[i] = value
    finally:
        for _, proc, receive, send in workers:
            send.close()  # (again: closing twice is harmless) not left open when start() was interrupted
            receive.close()
            _stop(proc)
    return results


def _child(send: Connection, fn: Callable[..., Any], args: tuple[object, ...], parent_pid: int) -> None:
    from specpack.export.parent_death import die_with_parent

    die_with_parent(parent_pid)  # a SIGKILLed parent runs no cleanup: the kernel ends the worker instead
    try:
        result: tuple[bool, object, str] = (True, fn(*args), "")
    except BaseException as err:
        result = (False, err, traceback.format_exc())
    try:
        send.send(result)
    except Exception:  # an exception that does not pickle: send its text
        send.send((False, RuntimeError(f"{type(result[1]).__name__}: {result[1]}"), result[2]))
    finally:
        send.close()


def _stop(proc: Any) -> None:
    if proc.pid is None:  # never started
        return
    if proc.is_alive():
        proc.terminate()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    proc.join()


def _died(fn: Callable[..., Any], exitcode: int | None) -> SpecpackError:
    how = f"killed by signal {-exitcode}" if exitcode is not None and exitcode < 0 else f"exit status {exitcode}"
    hint = ("SIGKILL is what the out-of-memory killer sends: the 1.5B export peaks near 11 GB; close other programs"
            if exitcode == -signal.SIGKILL else "run again with --debug for details")
    return SpecpackError(f"the export worker ({fn.__name__}) died", expected="the worker to finish and report",
                         found=how, hint=hint)


@contextlib.contextmanager
def staging_dir(out: Path) -> Iterator[Path]:
    """A fresh staging directory beside `out`; removed on any failure (or interrupt) inside the block."""
    base = f".{out.name}.partial-"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(out.parent, base)
        remove_stale(out.parent, f".{out.name}.old-")
        staging = Path(tempfile.mkdtemp(prefix=temp_prefix(base), dir=out.parent))
        staging.chmod(0o755)  # mkdtemp makes it private; a pack is an ordinary directory
    except OSError as err:
        raise (os_error(err, "creating the pack directory", out.parent) or err) from err
    try:
        yield staging
    except BaseException as err:
        full = _disk_nearly_full(staging)
        shutil.rmtree(staging, ignore_errors=True)
        if full and not isinstance(err, (SpecpackError, KeyboardInterrupt, SystemExit)):
            raise SpecpackError(f"writing the pack failed at {out.parent}: no space left on the device",
                                expected=f"room for the pack (less than {DISK_FULL_BYTES >> 20} MB was left)",
                                found=f"{type(err).__name__}: {str(err)[:200]}",
                                hint="free some space, or write the pack somewhere else") from err
        if isinstance(err, OSError) and (translated := os_error(err, "writing the pack", out.parent)) is not None:
            raise translated from err
        raise


def _disk_nearly_full(path: Path) -> bool:
    try:
        return shutil.disk_usage(path).free < DISK_FULL_BYTES
    except OSError:
        return False


def publish(staging: Path, out: Path, overwrite: bool) -> None:
    """Rename `staging` to `out`; an existing `out` is checked again (it may have changed) and replaced."""
    if not out.exists() and not out.is_symlink():
        staging.rename(out)
        return
    check_destination(out, overwrite)
    old = out.with_name(f"{temp_prefix(f'.{out.name}.old-')}{secrets.token_hex(4)}")
    out.rename(old)
    try:
        staging.rename(out)
    except BaseException:
        old.rename(out)  # the old pack stays where it was
        raise
    shutil.rmtree(old, ignore_errors=True)
