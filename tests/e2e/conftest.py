"""Packs exported from tiny pairs, built once per session (export in-process: no spawn per test)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

PackFactory = Callable[..., tuple[Path, Path, Path]]


@pytest.fixture(scope="session")
def tiny_pack(tiny_pairs: Callable[..., tuple[Path, Path]], tmp_path_factory: pytest.TempPathFactory) -> PackFactory:
    """(family, draft="small", k=8, max_len=None, **pair) -> (pack_dir, draft_dir, target_dir)."""
    built: dict[tuple[object, ...], tuple[Path, Path, Path]] = {}

    def make(family: str, draft: str = "small", k: int = 8, max_len: int | None = None,
             **pair: int) -> tuple[Path, Path, Path]:
        key = (family, draft, k, max_len, *sorted(pair.items()))
        if key not in built:
            from specpack.export.pipeline import ExportConfig, export_pack

            draft_dir, target_dir = tiny_pairs(family, draft, **pair)
            out = tmp_path_factory.mktemp(f"pack-{family}-{draft}") / "pack"
            export_pack(str(draft_dir), str(target_dir), out, ExportConfig(k=k, max_len=max_len, isolate=False))
            built[key] = (out, draft_dir, target_dir)
        return built[key]

    return make
