"""Exports never lose data: --overwrite replaces only packs, interrupts stop workers and remove the staging
directory, leftovers of killed runs are cleaned, and full or read-only disks are named as such."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import pytest
from click.testing import CliRunner

from specpack.cli.main import spec_export
from specpack.errors import SpecpackError
from specpack.export import staging
from specpack.export.staging import (
    check_destination,
    publish,
    remove_stale,
    run_isolated,
    run_isolated_all,
    staging_dir,
    temp_prefix,
)
from tests.export import staging_children

ROOT = Path(__file__).resolve().parents[2]


def _export(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(spec_export, ["--draft", "d", "--target", "t", *args])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def _fake_pack(path: Path, extra: str | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "verify.onnx").write_text("graph")
    (path / "manifest.json").write_text(json.dumps({"files": [{"path": "verify.onnx"}]}))
    (path / ".verified.json").write_text("{}")
    if extra:
        (path / extra).write_text("mine")
    return path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_overwrite_refuses_a_directory_that_is_not_a_pack(tmp_path: Path) -> None:
    """The issue's finding: `--overwrite` deleted any directory at -o (an unrelated precious.txt was gone)."""
    out = tmp_path / "data"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    code, text = _export("-o", str(out), "--overwrite")
    assert code == 2 and "replaces only a pack" in text and "precious.txt" in text
    assert (out / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize("kind", ["file", "pack with a file of mine", "symlink"])
def test_overwrite_refuses_other_things(tmp_path: Path, kind: str) -> None:
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("mine")
    elif kind == "symlink":
        out.symlink_to(_fake_pack(tmp_path / "real"))
    else:
        _fake_pack(out, extra="notes.txt")
    with pytest.raises(SpecpackError, match="replaces only a pack"):
        check_destination(out, overwrite=True)
    assert out.exists()


def test_overwrite_accepts_a_pack_or_an_empty_directory(tmp_path: Path) -> None:
    check_destination(_fake_pack(tmp_path / "pack"), overwrite=True)
    (tmp_path / "empty").mkdir()
    check_destination(tmp_path / "empty", overwrite=True)
    with pytest.raises(SpecpackError, match="already exists"):
        check_destination(tmp_path / "empty", overwrite=False)


def test_publish_replaces_a_pack_despite_a_stale_old_directory(tmp_path: Path) -> None:
    """The issue's finding: a stale `.NAME.old` made the rename fail after the whole export had run."""
    out = _fake_pack(tmp_path / "p")
    _fake_pack(tmp_path / ".p.old")  # what a killed run of an older version left
    new = _fake_pack(tmp_path / "staged")
    (new / "verify.onnx").write_text("new graph")
    publish(new, out, overwrite=True)
    assert (out / "verify.onnx").read_text() == "new graph" and not new.exists()
    assert not list(tmp_path.glob(".p.old-*"))


def test_a_failed_publish_keeps_the_old_pack(tmp_path: Path) -> None:
    out = _fake_pack(tmp_path / "p")
    with pytest.raises(FileNotFoundError):
        publish(tmp_path / "vanished", out, overwrite=True)
    assert (out / "verify.onnx").read_text() == "graph" and not list(tmp_path.glob(".p.old-*"))


def test_stale_temp_dirs_of_dead_processes_are_removed(tmp_path: Path) -> None:
    dead = tmp_path / f"{temp_prefix('.p.partial-').replace(str(os.getpid()), str(_dead_pid()))}abc"
    live = tmp_path / f"{temp_prefix('.p.partial-')}def"
    other_host = tmp_path / f".p.partial-{_dead_pid()}-00000000-ghi"
    for folder in (dead, live, other_host):
        folder.mkdir()
    assert remove_stale(tmp_path, ".p.partial-") == [dead]
    assert live.exists() and other_host.exists()


def test_a_new_staging_dir_cleans_what_killed_runs_left(tmp_path: Path) -> None:
    out = tmp_path / "p"
    dead = tmp_path / f"{temp_prefix('.p.partial-').replace(str(os.getpid()), str(_dead_pid()))}abc"
    dead.mkdir()
    with staging_dir(out) as folder:
        assert folder.parent == tmp_path and folder.name.startswith(temp_prefix(".p.partial-"))
    assert not dead.exists()


def test_destination_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    code, text = _export("-o", str(tmp_path / "file" / "pack"))
    assert code == 2 and "is a file, not a directory" in text


def test_read_only_destination(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    statvfs = os.statvfs
    Flags = namedtuple("Flags", "f_flag")
    monkeypatch.setattr(os, "statvfs", lambda p: Flags(os.ST_RDONLY) if Path(p) == tmp_path else statvfs(p))
    code, text = _export("-o", str(tmp_path / "pack"))
    assert code == 2 and "read-only file system" in text


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_directory_without_write_permission(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    code, text = _export("-o", str(locked / "pack"))
    assert code == 2 and "not writable" in text


def test_disk_full_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's finding: a full disk surfaced as "problem writing element 18432 to file"."""
    monkeypatch.setattr(staging, "_disk_nearly_full", lambda path: True)
    with pytest.raises(SpecpackError, match="no space left on the device") as err, staging_dir(tmp_path / "p"):
        raise RuntimeError("problem writing element 18432 to file")
    assert "problem writing element" in str(err.value)
    assert not list(tmp_path.glob(".p.partial-*"))


def test_os_errors_while_writing_are_named(tmp_path: Path) -> None:
    with pytest.raises(SpecpackError, match="no space left") as err, staging_dir(tmp_path / "p"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert "free some space" in str(err.value)


def test_worker_results_errors_and_deaths() -> None:
    assert run_isolated(staging_children.answer, 21) == 42
    with pytest.raises(SpecpackError, match="nope"):
        run_isolated(staging_children.refuse, "nope")
    with pytest.raises(SpecpackError, match="killed by signal 9") as err:
        run_isolated(staging_children.die)
    assert "out-of-memory" in str(err.value)


def test_workers_run_at_once_and_the_first_failure_stops_the_rest(tmp_path: Path) -> None:
    flag = tmp_path / "flag"  # the first worker waits for what the second makes: they run at the same time
    calls = [(staging_children.wait_for, (flag,)), (staging_children.make, (flag,))]
    assert run_isolated_all(calls) == ["seen", "made"]
    folder = tmp_path / "forever"
    folder.mkdir()
    with pytest.raises(SpecpackError, match="nope"):  # raised at once, not after the first worker (which never ends)
        run_isolated_all([(staging_children.write_forever, (folder,)), (staging_children.refuse, ("nope",))])
    pid = folder / "child.pid"  # absent if it was stopped before it got that far
    assert not pid.exists() or _gone(int(pid.read_text()))


STAGE_SCRIPT = """
import signal, sys
# as spec-export run from a terminal has it: a shell's background job (`cmd &`, nohup) starts with SIGINT
# ignored, and the test suite run that way passed that on, so SIGINT did nothing here and the test hung
signal.signal(signal.SIGINT, signal.default_int_handler)
from pathlib import Path
from specpack.export.staging import run_isolated, staging_dir, stop_on_signals
from tests.export.staging_children import write_forever

@stop_on_signals()
def main():
    with staging_dir(Path(sys.argv[1])) as folder:
        run_isolated(write_forever, folder)

main()
"""


def _wait_for(find, timeout: float = 120.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := find():
            return found
        time.sleep(0.1)
    raise AssertionError("timed out")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_the_worker_and_remove_the_staging_dir(tmp_path: Path, sig: signal.Signals) -> None:
    """The issue's finding: after SIGTERM the staging dir stayed and the worker kept writing into it."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-c", STAGE_SCRIPT, str(tmp_path / "p")], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE)
    pid_file = _wait_for(lambda: next(tmp_path.glob(".p.partial-*/child.pid"), None))
    child = int(_wait_for(pid_file.read_text))
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # fail, and leave no process behind (the worker holds the stderr pipe)
        for pid in (proc.pid, child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"still running 60 s after {sig.name}") from None
    assert proc.returncode == (128 + sig if sig == signal.SIGTERM else -sig), err.decode()  # SIGINT: re-raised
    assert list(tmp_path.iterdir()) == []
    assert _gone(child)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_sigkilled_parent_takes_its_worker_with_it(tmp_path: Path) -> None:
    """The issue's finding: SIGKILL runs no cleanup, and the export worker kept running (and writing)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-c", STAGE_SCRIPT, str(tmp_path / "p")], cwd=ROOT, env=env,
                            stderr=subprocess.DEVNULL)
    pid_file = _wait_for(lambda: next(tmp_path.glob(".p.partial-*/child.pid"), None))
    child = int(_wait_for(pid_file.read_text))
    proc.kill()
    proc.wait()
    try:
        _wait_for(lambda: _gone(child) or _zombie(child), timeout=5)  # its new parent may not reap it at once
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_sigterm_during_a_real_export(tiny_pairs, tmp_path: Path) -> None:
    """spec-export itself: SIGTERM while a worker exports a model leaves nothing behind and no worker running."""
    import psutil

    draft, target = tiny_pairs("qwen2", "noisy")
    code = "from specpack.cli.main import spec_export; spec_export()"
    proc = subprocess.Popen([sys.executable, "-c", code, "--draft", str(draft), "--target", str(target),
                             "-o", str(tmp_path / "p")], cwd=ROOT, stderr=subprocess.PIPE)
    parent = psutil.Process(proc.pid)

    def command(child: psutil.Process) -> str:  # "" for a child that ended meanwhile (a zombie: CI, 2026-12-07)
        try:
            return " ".join(child.cmdline())
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            return ""

    def exporting_worker() -> list[psutil.Process]:  # a spawned worker, once the staging dir exists
        spawned = [c for c in parent.children() if "spawn_main" in command(c)]
        return spawned if list(tmp_path.glob(".p.partial-*/work")) else []

    workers = _wait_for(exporting_worker, timeout=300)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()[-2000:]
    assert list(tmp_path.iterdir()) == []
    assert all(_gone(w.pid) for w in workers)
