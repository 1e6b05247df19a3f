"""Weight-only quantized graphs in the static KV cache form (spec-export --kv-cache static --quantize-* int4|int8):
the form token trees and the cuda backend's captured steps need, so a CPU user's int4 pack can verify trees. The
quantizer rewrites a plain graph's MatMuls whatever its cache form (quantize/stage.py); the fidelity stage replays
the concat form only and says it skipped a static pack (export/pipeline.py, measured_graphs).

- a model-drafter tree pack, both models int4: the graphs hold MatMulNBits, greedy output with trees auto / N / off,
  and with chains, is the quantized target's own k = 0 output, on the cpu backend and the cuda backend's code on the
  CPU EP;
- a head tree pack (target int4, head step int8): the same with the head's trees.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import onnx
import pytest

import specpack
from specpack import names
from specpack.contract.manifest import Manifest
from specpack.runtime.pack import Pack

PROMPTS = ("def add(a, b):", [5, 7, 11])


def _quantized_ops(graph: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(graph), load_external_data=False).graph.node} & {
        "MatMulNBits", "GatherBlockQuantized"}


@pytest.fixture(scope="module")
def tree_pack_dir(tiny_export: Callable[..., Path]) -> Path:
    return tiny_export("qwen2", "small", k=4, max_len=64, kv_cache="static", max_tree_nodes=8,
                       quantize_draft="int4", quantize_target="int4")


@pytest.fixture(scope="module")
def pack(tree_pack_dir: Path) -> Iterator[Pack]:
    loaded = specpack.load(tree_pack_dir, threads=1)
    yield loaded
    loaded.close()


def test_the_static_int4_tree_pack(tree_pack_dir: Path) -> None:
    manifest = Manifest.read(tree_pack_dir)
    assert manifest.target.graph.kv_cache == "static" and manifest.target.graph.tree is not None
    for entry in (manifest.target, manifest.draft):
        assert entry is not None and entry.quantization is not None and entry.quantization.method == "int4"
        assert "MatMulNBits" in _quantized_ops(tree_pack_dir / entry.graph.path)
    assert names.KV_COMPACT_FILE in manifest.loaded_files()


def test_greedy_trees_and_chains_on_int4_equal_the_quantized_target_alone(pack: Pack) -> None:
    for prompt in PROMPTS:
        want = pack.generate(prompt, 32, k=0).tokens
        for tree in ("auto", 3, 8, "off"):
            got = pack.generate(prompt, 32, drafter="model", tree=tree)
            assert got.tokens == want and got.stats["tree"] == (tree != "off"), (prompt, tree)
        assert pack.generate(prompt, 32, drafter="model", k=4, tree="off").tokens == want


def test_the_cuda_backends_code_on_an_int4_tree_pack(tree_pack_dir: Path, pack: Pack) -> None:
    """The device caches, kv_compact and the captured-step code paths over MatMulNBits graphs (CPU EP)."""
    from tests.runtime.test_cuda_backend import device_pack

    dev = device_pack(tree_pack_dir)
    try:
        want = pack.generate(PROMPTS[0], 32, k=0).tokens
        for tree in ("auto", 8, "off"):
            assert dev.generate(PROMPTS[0], 32, drafter="model", tree=tree).tokens == want, tree
        assert dev.generate(PROMPTS[0], 24, tree=4, temperature=0.8, top_k=20, seed=5).tokens == \
            pack.generate(PROMPTS[0], 24, tree=4, temperature=0.8, top_k=20, seed=5).tokens
    finally:
        dev.close()


@pytest.mark.slow  # a tiny head pack of its own (about 20 s on the shared 2-core VM)
def test_greedy_head_trees_on_an_int4_target(tiny_head_pack: Callable[..., tuple[Path, Path, Path]]) -> None:
    pack_dir, _, _ = tiny_head_pack("qwen2", kv_cache="static", max_tree_nodes=8, quantize_target="int4",
                                    quantize_draft="int8")
    manifest = Manifest.read(pack_dir)
    assert manifest.target.quantization is not None and manifest.target.quantization.method == "int4"
    assert manifest.head is not None and manifest.head.quantization is not None
    assert "MatMulNBits" in _quantized_ops(pack_dir / manifest.target.graph.path)
    # the tree step's lm_head quantized with the rest (its rows a folded initializer: tests/e2e/test_head_trees.py)
    step = onnx.load(str(pack_dir / names.HEAD_STEP_FILE), load_external_data=False).graph
    assert [n.op_type for n in step.node].count("MatMul") <= 2  # attention's two products only
    loaded = specpack.load(pack_dir, threads=1)
    try:
        for prompt in PROMPTS:
            want = loaded.generate(prompt, 32, k=0).tokens
            for tree in ("auto", 4, "off"):
                got = loaded.generate(prompt, 32, drafter="head", tree=tree)
                assert got.tokens == want and got.stats["tree"] == (tree != "off"), (prompt, tree)
    finally:
        loaded.close()


@pytest.mark.slow  # a tiny GGUF export of its own (about 20 s)
def test_a_gguf_sources_own_blocks_in_a_static_tree_pack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A .gguf source without --dequantize keeps its blocks (quantize --*-gguf, the default) in the static form too:
    greedy trees and chains give the pack's own k = 0 tokens."""
    pytest.importorskip("gguf")
    from specpack.export.pipeline import ExportConfig, export_pack
    from tests.quantize.gguf_fixture import write_kquant_gguf

    path = tmp_path / "tiny-kquant.gguf"
    write_kquant_gguf(path)
    monkeypatch.setenv("SPECPACK_CACHE", str(tmp_path / "cache"))  # the fp32 conversion is cached here, not in ~
    export_pack(str(path), str(path), tmp_path / "pack", ExportConfig(k=4, isolate=False, kv_cache="static",
                                                                      max_len=64, max_tree_nodes=8))
    manifest = Manifest.read(tmp_path / "pack")
    assert manifest.target.quantization is not None and manifest.target.quantization.method == "gguf"
    loaded = specpack.load(tmp_path / "pack", threads=1)
    try:
        want = loaded.generate(PROMPTS[1], 24, k=0).tokens
        for tree in ("auto", 8, "off"):
            assert loaded.generate(PROMPTS[1], 24, drafter="model", tree=tree).tokens == want, tree
    finally:
        loaded.close()
