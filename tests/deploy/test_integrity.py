"""Integrity cannot be switched off: each finding of the issue, reproduced on a copy of a real tiny pack."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import specpack
from specpack.cli.main import cli
from specpack.contract.integrity import STAMP_FILE
from specpack.contract.manifest import manifest_sha256
from specpack.errors import SpecpackError


def _edit(pack: Path, change: Callable[[dict[str, Any]], object]) -> None:
    manifest = json.loads((pack / "manifest.json").read_text())
    change(manifest)
    (pack / "manifest.json").write_text(json.dumps(manifest))


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def _refused(pack: Path, *fragments: str, **load: Any) -> str:
    with pytest.raises(SpecpackError) as err:
        specpack.load(pack, **load)
    for fragment in fragments:
        assert fragment in str(err.value)
    return str(err.value)


def test_emptied_file_list_no_longer_disables_the_check(pack: Path) -> None:
    _flip_byte(pack / "verify.onnx.data")
    _edit(pack, lambda m: m.update(files=[]))
    _refused(pack, "files")
    code, text = _cli("verify", str(pack))
    assert code == 2 and "ok" not in text


def test_graph_path_must_be_listed_and_inside(pack: Path) -> None:
    shutil.copy(pack / "verify.onnx", pack / "other.onnx")
    _edit(pack, lambda m: m["target"]["graph"].update(path="other.onnx"))
    _refused(pack, "not listed", "other.onnx")
    _edit(pack, lambda m: m["target"]["graph"].update(path="../verify.onnx"))
    _refused(pack, "relative POSIX path")


@pytest.mark.parametrize("path", ["/etc/passwd", "../../../../etc/passwd", "tokenizer/../../x"])
def test_paths_leaving_the_pack_are_refused_before_opening(pack: Path, path: str) -> None:
    _edit(pack, lambda m: m["files"].append({"path": path, "sha256": "0" * 64, "size": 1}))
    text = _refused(pack, "relative POSIX path")
    passwd = Path("/etc/passwd")
    if passwd.is_file():  # neither its size nor its hash may appear
        assert f"{passwd.stat().st_size} bytes" not in text
        assert hashlib.sha256(passwd.read_bytes()).hexdigest() not in text


@pytest.mark.parametrize("link", ["file", "folder"])
def test_symlinks_out_of_the_pack_are_refused(pack: Path, tmp_path: Path, link: str) -> None:
    """Even when the file outside is an exact copy (same hash): it is not the pack's file, and is never read."""
    outside = tmp_path / "outside"
    outside.mkdir()
    if link == "file":
        shutil.copy(pack / "tokenizer" / "tokenizer.json", outside / "tokenizer.json")
        (pack / "tokenizer" / "tokenizer.json").unlink()
        (pack / "tokenizer" / "tokenizer.json").symlink_to(outside / "tokenizer.json")
    else:
        shutil.move(pack / "tokenizer", outside / "tokenizer")
        (pack / "tokenizer").symlink_to(outside / "tokenizer")
    text = _refused(pack, "resolves outside the pack", "tokenizer")
    assert str(outside) not in text
    code, text = _cli("verify", str(pack))
    assert code == 2 and "outside the pack" in text


def test_symlink_inside_the_pack_is_fine(pack: Path) -> None:
    (pack / "store").mkdir()
    shutil.move(pack / "verify.onnx.data", pack / "store" / "verify.onnx.data")
    (pack / "verify.onnx.data").symlink_to(Path("store") / "verify.onnx.data")
    specpack.load(pack).close()


def test_changed_file_with_restored_mtime_is_hashed_again(pack: Path) -> None:
    specpack.load(pack).close()  # a full check writes the stamp
    assert (pack / STAMP_FILE).is_file()
    victim = pack / "verify.onnx.data"
    st = victim.stat()
    _flip_byte(victim)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # `touch -r`: same size, same mtime
    assert victim.stat().st_mtime_ns == st.st_mtime_ns
    _refused(pack, "does not match the manifest", "verify.onnx.data")


def test_stamp_is_never_written_through_a_symlink(pack: Path, tmp_path: Path) -> None:
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    (pack / STAMP_FILE).symlink_to(victim)
    specpack.load(pack).close()
    assert victim.read_text() == "keep me"
    assert not (pack / STAMP_FILE).is_symlink()


def test_special_file_is_refused_without_hanging(pack: Path) -> None:
    (pack / "verify.onnx.data").unlink()
    os.mkfifo(pack / "verify.onnx.data")
    _refused(pack, "not a regular file")


def test_verify_reports_extra_files(pack: Path) -> None:
    (pack / "notes.txt").write_text("hello")
    (pack / "tokenizer" / "extra\x1b[31m.json").write_text("{}")
    code, text = _cli("verify", str(pack))
    assert code == 0 and "2 files in the pack are not in the manifest" in text
    assert "notes.txt" in text and "extra\\x1b[31m.json" in text and "\x1b" not in text


def test_pinned_manifest_digest(pack: Path) -> None:
    digest = manifest_sha256(pack)
    code, text = _cli("inspect", str(pack))
    assert code == 0 and digest in text
    specpack.load(pack, manifest_sha256=digest).close()
    _edit(pack, lambda m: m.update(eos_token_ids=[3]))  # a valid, but different, manifest
    _refused(pack, "pinned", digest, manifest_sha256=digest)
    code, text = _cli("verify", str(pack), "--manifest-sha256", digest)
    assert code == 2 and "pinned" in text
    code, text = _cli("generate", str(pack), "--prompt", "hi", "--manifest-sha256", digest)
    assert code == 2 and "pinned" in text
    code, text = _cli("generate", str(pack), "--prompt", "hi", "--manifest-sha256", "xyz")
    assert code == 2 and "64 hex digits" in text


def test_graph_described_wrongly_is_refused_at_load(pack: Path) -> None:
    """A manifest that passes the schema but does not describe the graph the hashes vouch for."""
    def change(m: dict[str, Any]) -> None:
        spec = next(s for s in m["draft"]["graph"]["inputs"] if s["name"] == "temperature")
        spec["dtype"] = "float16"
    _edit(pack, change)
    loaded = specpack.load(pack)  # the draft's session opens on first use (k = 0 never opens it): checked then
    with pytest.raises(SpecpackError) as err:
        loaded.generate("def add(a, b):", 4, k=2)
    assert "draft_step.onnx does not match the manifest's description" in str(err.value)
    assert "temperature" in str(err.value)
