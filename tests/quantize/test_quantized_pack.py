"""Packs with weight-only quantized graphs on ONNX Runtime's CPU EP: a quantized draft changes nothing in greedy
output (the target decides every token), a quantized target is decoded losslessly with respect to itself, and
the manifest records each graph's quantization and fidelity."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import onnx
import pytest
from click.testing import CliRunner

from specpack import names
from specpack.cli.main import cli
from specpack.export.pipeline import ExportConfig, export_pack

HEAD_DIM = 16
PROMPTS = ([5, 17, 33, 101], [7, 8, 9], [250, 3, 3, 40, 41, 42])


@pytest.fixture(scope="module")
def packs(tiny_pairs: Callable[..., tuple[Path, Path]], tmp_path_factory: pytest.TempPathFactory,
          shared_plain_exports: Callable[[], AbstractContextManager[None]]) -> dict[str, Path]:
    """The same noisy pair three ways: unquantized, int4 draft, int8 draft + int4 target (each model's fp32 plain
    graph exported once for the three: conftest.py, shared_plain_exports)."""
    draft, target = tiny_pairs("qwen2", "noisy", head_dim=HEAD_DIM)
    root = tmp_path_factory.mktemp("quantized-packs")
    settings = {"none": {}, "int4-draft": {"quantize_draft": "int4"},
                "int8-draft-int4-target": {"quantize_draft": "int8", "quantize_target": "int4"}}
    with shared_plain_exports():
        for name, options in settings.items():
            export_pack(str(draft), str(target), root / name, ExportConfig(k=4, isolate=False, **options))
    return {name: root / name for name in settings}


def _decode(pack_dir: Path, k: int) -> list[list[int]]:
    import specpack

    pack = specpack.load(pack_dir)
    try:
        return [pack.generate(p, 24, k=k).tokens for p in PROMPTS]
    finally:
        pack.close()


def _manifest(pack_dir: Path) -> dict[str, Any]:
    return json.loads((pack_dir / "manifest.json").read_text())


def test_quantized_draft_leaves_greedy_output_identical(packs: dict[str, Path]) -> None:
    target_alone = _decode(packs["none"], k=0)
    assert _decode(packs["int4-draft"], k=4) == target_alone
    assert _decode(packs["int4-draft"], k=1) == target_alone


def test_quantized_target_is_decoded_losslessly_against_itself(packs: dict[str, Path]) -> None:
    pack = packs["int8-draft-int4-target"]
    assert _decode(pack, k=4) == _decode(pack, k=0)


def test_graphs_hold_matmul_nbits(packs: dict[str, Path]) -> None:
    for name, bits in (("int4-draft", {"draft": 4}), ("int8-draft-int4-target", {"draft": 8, "target": 4})):
        for role, graph_file in (("draft", names.DRAFT_STEP_FILE), ("target", names.VERIFY_FILE)):
            graph = onnx.load(str(packs[name] / graph_file), load_external_data=False).graph
            nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
            if role not in bits:
                assert not nbits
                continue
            assert nbits and {a.i for n in nbits for a in n.attribute if a.name == "bits"} == {bits[role]}
            assert any(n.op_type == "GatherBlockQuantized" for n in graph.node)
            assert _manifest(packs[name])[role]["quantization"]["bits"] == bits[role]


def test_manifest_records_fidelity(packs: dict[str, Path]) -> None:
    assert _manifest(packs["none"])["draft"]["quantization"] is None
    draft = _manifest(packs["int4-draft"])["draft"]["quantization"]
    assert draft["method"] == "int4" and draft["accuracy_level"] == 4 and draft["block_size"] == 32
    by_k = draft["fidelity"]["by_k"]
    assert set(by_k) == {"1", "2", "4"}
    for row in by_k.values():
        assert 0.0 <= row["quantized"]["alpha"] <= 1.0 and 0.0 <= row["reference"]["alpha"] <= 1.0
        assert row["alpha_delta"] == pytest.approx(row["quantized"]["alpha"] - row["reference"]["alpha"])
    target = _manifest(packs["int8-draft-int4-target"])["target"]["quantization"]
    assert target["fidelity"]["positions"] > 0 and 0.0 < target["fidelity"]["top1_agreement"] <= 1.0
    assert "by_k" in _manifest(packs["int8-draft-int4-target"])["draft"]["quantization"]["fidelity"]


def test_inspect_json_has_the_records(packs: dict[str, Path]) -> None:
    result = CliRunner().invoke(cli, ["inspect", str(packs["int4-draft"]), "--json"])
    assert result.exit_code == 0
    assert json.loads(result.output)["manifest"]["draft"]["quantization"]["method"] == "int4"
