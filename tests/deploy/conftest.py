"""Deploy fixtures: `pack`, a fresh copy of a real tiny pack (without its stamp) for tests that alter it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specpack.contract.integrity import STAMP_FILE


@pytest.fixture(scope="module")
def original(tiny_pack) -> Path:
    return tiny_pack("qwen2", "noisy")[0]


@pytest.fixture
def pack(original: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "pack"
    shutil.copytree(original, copy, ignore=shutil.ignore_patterns(STAMP_FILE))
    return copy
