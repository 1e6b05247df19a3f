"""A pinned pack cannot be swapped: the stamp is never trusted, and what runs is the bytes that were hashed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import specpack
from specpack.cli.main import cli
from specpack.contract import integrity
from specpack.contract.integrity import STAMP_FILE, stamp_key
from specpack.contract.manifest import Manifest, manifest_sha256
from specpack.contract.verified_read import GraphBytes, graph_bytes
from specpack.errors import SpecpackError
from specpack.runtime.ort_session import OrtGraph


def _weights(pack: Path, role: str) -> Path:
    graph = getattr(Manifest.read(pack), role).graph
    return pack / (graph.data_files[0] if graph.data_files else graph.path)


def _tamper(path: Path) -> None:
    """Flip 64 bytes in the middle of the file, keeping its size."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle: middle + 64] = bytes(b ^ 0x5A for b in data[middle: middle + 64])
    path.write_bytes(bytes(data))


def _forge_stamp(pack: Path) -> None:
    """What an attacker who can write the pack does: a stamp with the tampered files' new stat values."""
    manifest = Manifest.read(pack)
    integrity._write_stamp(pack, {e.path: stamp_key(pack / e.path, e) for e in manifest.files})


def test_a_forged_stamp_is_never_trusted_with_a_pin(pack: Path) -> None:
    digest = manifest_sha256(pack)
    _tamper(_weights(pack, "target"))
    _forge_stamp(pack)
    specpack.load(pack).close()  # without a pin the stamp vouches for the file (docs/security.md says so)
    with pytest.raises(SpecpackError, match="does not match the pinned manifest"):
        specpack.load(pack, manifest_sha256=digest)


def test_a_swap_after_a_pinned_load_is_never_used(pack: Path) -> None:
    digest = manifest_sha256(pack)
    loaded = specpack.load(pack, manifest_sha256=digest)
    try:
        assert loaded.backend.draft_loaded  # every graph opened at load
        before = loaded.generate([1, 2, 3, 4], 12, k=3).tokens
        for path in {_weights(pack, "draft"), _weights(pack, "target"), pack / Manifest.read(pack).draft.graph.path}:
            _tamper(path)
        assert loaded.generate([1, 2, 3, 4], 12, k=3).tokens == before
    finally:
        loaded.close()


@pytest.mark.parametrize(("device", "role"), [("cpu", "target"), ("cpu", "draft"), ("reference", "draft")])
def test_a_swap_between_the_check_and_the_read_is_refused(pack: Path, monkeypatch: pytest.MonkeyPatch, device: str,
                                                          role: str) -> None:
    digest = manifest_sha256(pack)
    specpack.load(pack, device=device, manifest_sha256=digest).close()
    check = integrity.verify_pack

    def check_then_swap(*args: object, **kwargs: object) -> list[str]:
        hashed = check(*args, **kwargs)  # type: ignore[arg-type]
        _tamper(_weights(pack, role))
        return hashed

    monkeypatch.setattr("specpack.runtime.pack.verify_pack", check_then_swap)
    with pytest.raises(SpecpackError, match="does not match the pinned manifest") as err:
        specpack.load(pack, device=device, manifest_sha256=digest)
    assert _weights(pack, role).name in str(err.value)


def test_a_pinned_tokenizer_is_read_from_the_bytes_hashed(pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    digest = manifest_sha256(pack)
    check = integrity.verify_pack

    def check_then_swap(*args: object, **kwargs: object) -> list[str]:
        hashed = check(*args, **kwargs)  # type: ignore[arg-type]
        (pack / "tokenizer" / "tokenizer.json").write_text("{}")
        return hashed

    monkeypatch.setattr("specpack.runtime.pack.verify_pack", check_then_swap)
    with pytest.raises(SpecpackError, match=r"tokenizer/tokenizer\.json does not match the pinned manifest"):
        specpack.load(pack, manifest_sha256=digest)


def test_graph_bytes_never_fall_back_to_files_on_disk(pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = Manifest.read(pack)
    verified = graph_bytes(pack, manifest, manifest.target.graph)
    assert verified.external, "the tiny pack's graphs keep their weights in external data"
    OrtGraph(verified).close()
    monkeypatch.chdir(pack)  # where ONNX Runtime would look for a graph given as bytes
    with pytest.raises(SpecpackError, match="could not load"):
        OrtGraph(GraphBytes(verified.name, verified.model, {}))


def test_serve_takes_the_pin(pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(cli, ["serve", str(pack), "--port", "0", "--manifest-sha256", "0" * 64])
    assert result.exit_code == 2 and "pinned" in result.output and "Traceback" not in result.output
    import specpack.serve.server as server

    served: list[object] = []
    monkeypatch.setattr(server, "serve", lambda config, loaded=None: served.append(server.load_pack(config)))
    result = CliRunner().invoke(cli, ["serve", str(pack), "--manifest-sha256", manifest_sha256(pack)])
    assert result.exit_code == 0 and isinstance(served[0], specpack.Pack), result.output
    assert served[0].backend.draft_loaded  # pinned: every graph opened at load
    served[0].close()


def test_stamp_that_is_a_directory_is_ignored(pack: Path) -> None:
    os.mkdir(pack / STAMP_FILE)
    specpack.load(pack).close()
    assert integrity.verify_pack(pack, Manifest.read(pack))  # hashed: nothing vouched for the files
