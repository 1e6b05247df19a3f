"""Shared session fixtures: tiny random model pairs (tests/tiny.py) and their plain ONNX exports, built once.

    tiny_pairs(family, draft="small", head_dim=12, max_positions=256, pad_rows=0) -> (draft_dir, target_dir)
    tiny_plain_graph(family, role="target", dtype="fp32", kv_cache="concat", attention="standard",
                     **pair options)                                           -> plain .onnx path (export/)
    tiny_pack(family, draft="small", k=8, max_len=None, **pair options)        -> (pack_dir, draft_dir, target_dir)
    tiny_ngram_pack(family, k=8, **pair options)                               -> (pack_dir, target_dir): no draft model

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
    """A factory of exported plain graphs of tiny models: (family, role="target"|"draft", dtype, kv_cache,
    attention, **pair) -> .onnx."""
    built: dict[tuple[object, ...], Path] = {}

    def make(family: str, role: str = "target", dtype: str = "fp32", kv_cache: str = "concat",
             attention: str = "standard", **pair: int | str) -> Path:
        key = (family, role, dtype, kv_cache, attention, *sorted(pair.items()))
        if key not in built:
            from specpack.export.graph_form import GraphForm
            from specpack.export.torch_export import export_plain_graph

            draft_dir, target_dir = tiny_pairs(family, **pair)
            out = tmp_path_factory.mktemp(f"plain-{family}-{role}-{dtype}-{kv_cache}-{attention}") / f"{role}.onnx"
            export_plain_graph(target_dir if role == "target" else draft_dir, out, dtype, GraphForm(kv_cache, attention))
            built[key] = out
        return built[key]

    return make


@pytest.fixture(scope="session")
def tiny_pack(tiny_pairs: PairFactory, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, Path, Path]]:
    """(family, draft="small", k=8, max_len=None, kv_cache="concat", attention="auto", **pair)
    -> (pack_dir, draft_dir, target_dir)."""
    built: dict[tuple[object, ...], tuple[Path, Path, Path]] = {}

    def make(family: str, draft: str = "small", k: int = 8, max_len: int | None = None, kv_cache: str = "concat",
             attention: str = "auto", **pair: int) -> tuple[Path, Path, Path]:
        key = (family, draft, k, max_len, kv_cache, attention, *sorted(pair.items()))
        if key not in built:
            from specpack.export.pipeline import ExportConfig, export_pack

            draft_dir, target_dir = tiny_pairs(family, draft, **pair)
            out = tmp_path_factory.mktemp(f"pack-{family}-{draft}-{kv_cache}") / "pack"
            export_pack(str(draft_dir), str(target_dir), out,
                        ExportConfig(k=k, max_len=max_len, kv_cache=kv_cache, attention=attention, isolate=False))
            built[key] = (out, draft_dir, target_dir)
        return built[key]

    return make


@pytest.fixture(scope="session")
def trt_pack(tiny_pairs: PairFactory, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny qwen2 pack in the form TensorRT engines are built from (static KV cache, standard ops), k 4,
    max_len 64; tests copy it before they add engines (tests/deploy/test_trt_build.py)."""
    from specpack.export.pipeline import ExportConfig, export_pack

    draft_dir, target_dir = tiny_pairs("qwen2")
    out = tmp_path_factory.mktemp("pack-trt") / "pack"
    export_pack(str(draft_dir), str(target_dir), out,
                ExportConfig(k=4, max_len=64, kv_cache="static", attention="standard", isolate=False))
    return out


@pytest.fixture(scope="session")
def tiny_ngram_pack(tiny_pairs: PairFactory, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, Path]]:
    """(family, k=8, **pair) -> (pack_dir, target_dir): a pack exported with --drafter ngram (the target alone)."""
    built: dict[tuple[object, ...], tuple[Path, Path]] = {}

    def make(family: str, k: int = 8, **pair: int) -> tuple[Path, Path]:
        key = (family, k, *sorted(pair.items()))
        if key not in built:
            from specpack.export.pipeline import ExportConfig, export_pack

            _, target_dir = tiny_pairs(family, **pair)
            out = tmp_path_factory.mktemp(f"ngram-pack-{family}") / "pack"
            export_pack(None, str(target_dir), out, ExportConfig(k=k, isolate=False, drafter="ngram"))
            built[key] = (out, target_dir)
        return built[key]

    return make
