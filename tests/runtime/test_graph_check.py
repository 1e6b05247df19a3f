"""A manifest whose `kv_cache` does not describe its graphs is refused at load, not with raw shape errors later."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import specpack
from specpack.contract.integrity import STAMP_FILE
from specpack.errors import SpecpackError


def _with_kv_cache(pack: Path, tmp_path: Path, kv_cache: str) -> Path:
    copy = tmp_path / "pack"
    shutil.copytree(pack, copy, ignore=shutil.ignore_patterns(STAMP_FILE))
    manifest = json.loads((copy / "manifest.json").read_text())
    for role in ("draft", "target"):
        manifest[role]["graph"]["kv_cache"] = kv_cache
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def test_a_concat_pack_said_to_be_static_is_refused(tiny_pack, tmp_path: Path) -> None:
    pack = _with_kv_cache(tiny_pack("qwen2", "noisy")[0], tmp_path, "static")
    with pytest.raises(SpecpackError, match="not of the KV cache form the manifest says") as err:
        specpack.load(pack)
    assert "a concat-cache graph" in str(err.value)


def test_a_static_pack_said_to_be_concat_is_refused(trt_pack: Path, tmp_path: Path) -> None:
    pack = _with_kv_cache(trt_pack, tmp_path, "concat")
    with pytest.raises(SpecpackError, match="not of the KV cache form the manifest says") as err:
        specpack.load(pack)
    assert "a static-cache graph" in str(err.value)

