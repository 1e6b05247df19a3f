"""A pack carried as verified pieces and written back as a private copy (specpack/serve/pack_copy.py; no Ray here:
test_ray_serve.py carries it through Ray's object store). Fast: the tiny pack's files on the local disk."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import specpack
from specpack.contract.manifest import manifest_sha256
from specpack.errors import SpecpackError
from specpack.serve import pack_copy
from specpack.serve.pack_copy import COPY_PREFIX, materialize, pack_pieces, remove_copy

PROMPT = "def fibonacci(n):\n    "


@pytest.fixture(scope="module")
def pack_dir(tiny_pack: Callable[..., tuple[Path, Path, Path]]) -> Path:
    return tiny_pack("qwen2", "noisy")[0]


def _carried(pack_dir: Path, pin: str) -> list[tuple[str, list[bytes]]]:
    return [(path, list(pieces)) for path, pieces in pack_pieces(pack_dir, pin)]


def test_a_copy_of_the_pieces_loads_pinned_and_generates_the_same(pack_dir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pack_copy, "PIECE_BYTES", 4096)  # every file of more than 4 KiB in several pieces
    pin = manifest_sha256(pack_dir)
    files = _carried(pack_dir, pin)
    assert files[0][0] == "manifest.json"
    assert all(len(piece) <= 4096 for _, pieces in files[1:] for piece in pieces)  # (the manifest: one, size-capped)
    assert max(len(pieces) for _, pieces in files) > 1
    copy = materialize(files, tmp_path)
    assert copy.parent == tmp_path and copy.name.startswith(f"{COPY_PREFIX}{os.getpid()}-")
    assert [p.name for p in tmp_path.iterdir()] == [copy.name]  # no partial directory left
    with specpack.load(pack_dir) as original, specpack.load(copy, manifest_sha256=pin) as copied:
        assert copied.generate(PROMPT, 12).text == original.generate(PROMPT, 12).text
    remove_copy(copy)
    assert not copy.exists()


def test_a_file_that_does_not_match_the_pin_is_refused_as_read(pack_dir: Path, tmp_path: Path) -> None:
    tampered = tmp_path / "pack"
    shutil.copytree(pack_dir, tampered)
    pin = manifest_sha256(pack_dir)
    graph = next(p for p in sorted(tampered.rglob("*.onnx*")) if p.stat().st_size > 0)
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 1
    graph.write_bytes(bytes(data))
    with pytest.raises(SpecpackError, match="does not match the pinned manifest") as err:
        _carried(tampered, pin)
    assert err.value.expected and "sha256" in err.value.expected
    (tampered / "manifest.json").write_text((tampered / "manifest.json").read_text() + " ")
    with pytest.raises(SpecpackError, match="not the manifest this pack was pinned to"):
        _carried(tampered, pin)


def test_a_copy_that_fails_midway_leaves_nothing(tmp_path: Path) -> None:
    def pieces() -> Iterator[bytes]:
        yield b"x" * 100
        raise ConnectionError("the object store went away")

    with pytest.raises(ConnectionError):
        materialize([("manifest.json", [b"{}"]), ("graphs/a.onnx", pieces())], tmp_path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SpecpackError, match="leaves the pack"):
        materialize([("../escape", [b"x"])], tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_copies_of_a_dead_process_are_removed_by_the_next_copy(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    pid = int(dead.stdout)
    orphans = [tmp_path / f"{COPY_PREFIX}{pid}-abc", tmp_path / f".{COPY_PREFIX}{pid}-def.partial"]
    mine = tmp_path / f"{COPY_PREFIX}{os.getpid()}-ghi"  # a live process's copy stays
    for folder in [*orphans, mine]:
        folder.mkdir()
        (folder / "manifest.json").write_text("{}")
    copy = materialize([("manifest.json", [b"{}"])], tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, copy.name])
