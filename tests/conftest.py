"""Shared session fixtures: tiny random model pairs (tests/tiny.py) and their plain ONNX exports, built once.

    tiny_pairs(family, draft="small", head_dim=12, max_positions=256, pad_rows=0) -> (draft_dir, target_dir)
    tiny_plain_graph(family, role="target", dtype="fp32", **pair options)       -> plain .onnx path (export/)
    tiny_pack(family, draft="small", k=8, max_len=None, **pair options)        -> (pack_dir, draft_dir, target_dir)

torch and transformers are imported inside the fixtures only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:  # `import tiny` from any test: pytest puts the rootdir, not tests/, on sys.path
    sys.path.insert(0, _TESTS)

PairFactory = Callable[..., tuple[Path, Path]]


@pytest.fixture(scope="session")
def tiny_pairs(tmp_path_factory: pytest.TempPathFactory) -> PairFactory:
    """A factory of tiny (draft_dir, target_dir) pairs, one build per distinct argument set per session."""
    built: dict[tuple[object, ...], tuple[Path, Path]] = {}

    def make(family: str, draft: str = "small", head_dim: int = 12, max_positions: int = 256,
             pad_rows: int = 0) -> tuple[Path, Path]:
        key = (family, draft, head_dim, max_positions, pad_rows)
        if key not in built:
            import tiny

            root = tmp_path_factory.mktemp(f"pair-{family}-{draft}-h{head_dim}-p{max_positions}-r{pad_rows}")
            built[key] = tiny.make_pair(family, root, draft, head_dim=head_dim,
                                        max_positions=max_positions, pad_rows=pad_rows)
        return built[key]

    return make


@pytest.fixture(scope="session")
def tiny_plain_graph(tiny_pairs: PairFactory, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """A factory of exported plain graphs of tiny models: (family, role="target"|"draft", dtype, **pair) -> .onnx."""
    built: dict[tuple[object, ...], Path] = {}

    def make(family: str, role: str = "target", dtype: str = "fp32", **pair: int | str) -> Path:
        key = (family, role, dtype, *sorted(pair.items()))
        if key not in built:
            from specpack.export.torch_export import export_plain_graph

            draft_dir, target_dir = tiny_pairs(family, **pair)
            out = tmp_path_factory.mktemp(f"plain-{family}-{role}-{dtype}") / f"{role}.onnx"
            export_plain_graph(target_dir if role == "target" else draft_dir, out, dtype)
            built[key] = out
        return built[key]

    return make


@pytest.fixture(scope="session")
def tiny_pack(tiny_pairs: PairFactory, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, Path, Path]]:
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
