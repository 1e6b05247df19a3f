"""Calibrated Q/DQ modes (int8-sq, fp8) on tiny models: Q/DQ nodes of INT8 / FLOAT8E4M3FN on every weight
MatMul but the lm_head, graphs that run on ONNX Runtime's CPU EP, a seeded and hashed calibration set, the cache,
clear errors for bad prompt files, and a quantized draft that leaves greedy output identical to the target's."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto

import specpack
from specpack.calibration.qdq import prefill_feeds, quantize_calibrated, weight_matmuls
from specpack.calibration.sets import calibration_set
from specpack.errors import SpecpackError
from specpack.export.config import ExportConfig

PROMPTS = ["def add(a, b):", "The quick brown fox jumps over", "import os\nimport sys", "Hello there, how are you?",
           "for i in range(10):\n    print(i)", "Once upon a time"]
QTYPES = {"int8-sq": TensorProto.INT8, "fp8": TensorProto.FLOAT8E4M3FN}
GOLDEN_PROMPTS = ["def add(a, b):", "Hello", [3]]


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("calib") / "prompts.txt"
    path.write_text("\n".join(p.replace("\n", " ") for p in PROMPTS) + "\n")
    return path


def _qdq_types(model: onnx.ModelProto) -> set[int]:
    """Element types of every QuantizeLinear's output (its zero point's type) and of every quantized weight (a
    DequantizeLinear's initializer input)."""
    inits = {t.name: t.data_type for t in model.graph.initializer}
    consts = {n.output[0]: n.attribute[0].t.data_type for n in model.graph.node if n.op_type == "Constant"}
    activations = {inits.get(n.input[2], consts.get(n.input[2])) for n in model.graph.node
                   if n.op_type == "QuantizeLinear" and len(n.input) > 2}
    weights = {inits[n.input[0]] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits}
    assert activations and weights, "no quantized activations or weights"
    return activations | weights


def _dequantized_inputs(model: onnx.ModelProto, node_names: list[str]) -> list[str]:
    """The listed MatMuls whose two inputs do not both come from a DequantizeLinear."""
    producer = {o: n.op_type for n in model.graph.node for o in n.output}
    nodes = {n.name: n for n in model.graph.node}
    return [name for name in node_names
            if name not in nodes or any(producer.get(i) != "DequantizeLinear" for i in nodes[name].input)]


def test_calibration_set_is_seeded_and_hashed(tiny_pairs: Callable[..., tuple[Path, Path]], prompt_file: Path) -> None:
    _, target_dir = tiny_pairs("qwen2", "noisy")
    a, b = (calibration_set(prompt_file, 3, 0, target_dir) for _ in range(2))
    c = calibration_set(prompt_file, 3, 1, target_dir)
    assert a == b and a.samples == 3 and a.sha256 != c.sha256
    assert calibration_set(prompt_file, 100, 0, target_dir).samples == len(PROMPTS)  # all, when fewer


@pytest.mark.parametrize(("content", "message"), [
    ("", "no prompts in"),
    ('{"task_id": "a", "prompt": "x"}\n{"task_id": "b"\n', "line 2 is not a JSON object"),
    ('{"what": "ever"}\n', "unknown prompt record"),
    ('{"task_id": "a", "prompt": ""}\n', "empty prompt"),
])
def test_bad_prompt_file_fails_clearly(tiny_pairs: Callable[..., tuple[Path, Path]], tmp_path: Path, content: str,
                                       message: str) -> None:
    draft_dir, target_dir = tiny_pairs("qwen2", "noisy")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    with pytest.raises(SpecpackError, match=message):
        calibration_set(bad, 4, 0, target_dir)
    from specpack.cli.export_cmd import export_command

    result = CliRunner().invoke(export_command, ["--draft", str(draft_dir), "--target", str(target_dir), "-o",
                                                 str(tmp_path / "pack"), "--quantize-draft", "int8-sq",
                                                 "--calib-prompts", str(bad)])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "pack").exists()


def test_calibrated_mode_needs_prompts() -> None:
    with pytest.raises(SpecpackError, match="needs a calibration set"):
        ExportConfig(quantize_target="fp8")
    with pytest.raises(SpecpackError, match="invalid --calib-samples"):
        ExportConfig(quantize_draft="fp8", calib_prompts="p.txt", calib_samples=0)


@pytest.mark.parametrize("method", ["int8-sq", "fp8"])
def test_qdq_graph_types_run_and_cache(tiny_plain_graph: Callable[..., Path], tiny_pairs: Callable[..., tuple[Path, Path]],
                                       prompt_file: Path, tmp_path: Path, method: str) -> None:
    plain = tiny_plain_graph("qwen2", "target")
    _, target_dir = tiny_pairs("qwen2", "noisy")
    calib = calibration_set(prompt_file, 4, 0, target_dir)
    out = tmp_path / f"target.{method}.onnx"
    record = quantize_calibrated(plain, out, method, calib, cache_root=tmp_path / "cache")
    model = onnx.load(str(out), load_external_data=False)
    assert _qdq_types(model) == {QTYPES[method]}
    weights = weight_matmuls(onnx.load(str(plain), load_external_data=False).graph)
    assert len(weights) > 0 and _dequantized_inputs(model, weights) == []  # both inputs of each: Q/DQ
    assert record["calibration"]["samples"] == 4 and record["calibration"]["dataset_sha256"] == calib.sha256
    assert "nvidia-modelopt" in record["calibration"]["versions"]
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], next(prefill_feeds(session, calib)))[0]
    assert logits.shape[-1] > 0 and np.isfinite(logits).all()
    again = quantize_calibrated(plain, tmp_path / "again.onnx", method, calib, cache_root=tmp_path / "cache")
    assert again["cached"] and again["calibration"] == record["calibration"]
    assert _qdq_types(onnx.load(str(tmp_path / "again.onnx"), load_external_data=False)) == {QTYPES[method]}


def _reference(target_dir: Path, ids: list[int], max_new: int, eos: list[int]) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("method", ["int8-sq", "fp8"])
def test_quantized_draft_keeps_greedy_output(tiny_pairs: Callable[..., tuple[Path, Path]], prompt_file: Path,
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str,
                                             shared_plain_exports: Callable[[], AbstractContextManager[None]]) -> None:
    from specpack.export.pipeline import export_pack

    monkeypatch.setenv("SPECPACK_CACHE", str(tmp_path / "cache"))
    draft_dir, target_dir = tiny_pairs("qwen2", "noisy")
    with shared_plain_exports():  # the fp32 plain graphs of the tiny qwen2 packs; calibrated and quantized here
        pack_dir = export_pack(str(draft_dir), str(target_dir), tmp_path / "pack",
                               ExportConfig(k=4, quantize_draft=method, calib_prompts=str(prompt_file),
                                            calib_samples=4, isolate=False, fidelity_tokens=8))
    manifest = json.loads((pack_dir / "manifest.json").read_text())
    record = manifest["draft"]["quantization"]
    assert record["method"] == method and record["calibration"]["samples"] == 4
    assert all(0.0 <= row["quantized"]["alpha"] <= 1.0 for row in record["fidelity"]["by_k"].values())
    assert _qdq_types(onnx.load(str(pack_dir / "draft_step.onnx"), load_external_data=False)) == {QTYPES[method]}
    pack = specpack.load(pack_dir)
    for prompt in GOLDEN_PROMPTS:
        ids = pack.encode(prompt)
        ref = _reference(target_dir, ids, 24, pack.manifest.eos_token_ids)
        for k in (1, 4):
            assert pack.generate(prompt, 24, k=k).tokens == ref, (prompt, k)


def test_inspect_describes_a_calibrated_target_and_warns() -> None:
    from specpack.cli.pack_cmds import quantization_lines
    from specpack.contract.manifest import Quantization

    q = Quantization.model_validate({
        "method": "fp8", "bits": 8, "summary": {"weight_matmuls": 84},
        "calibration": {"method": "max", "samples": 32, "dataset_sha256": "a" * 64,
                        "versions": {"nvidia-modelopt": "0.47.0"}},
        "fidelity": {"top1_agreement": 0.97, "mean_kl": 0.01, "positions": 100}})
    lines = quantization_lines("target", q)
    assert "fp8 Q/DQ of weights and activations (84 MatMuls), calibrated on 32 samples" in lines[0]
    assert any("a quantized target is a different model" in line for line in lines)
    assert any("top-1 agreement 0.9700" in line for line in lines)
