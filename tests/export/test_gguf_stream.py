"""The streaming GGUF conversion writes the same model.safetensors (byte for byte) and config.json as transformers'
whole-model load + save_pretrained: qwen2 tied and untied, llama with its reverse q/k permutation; F32, F16, Q8_0,
Q4_K and Q6_K tensors, dequantized a few rows at a time. What it does not cover it declines, writing nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specpack.export import gguf_stream
from specpack.export.gguf import save_whole
from specpack.export.gguf_stream import WEIGHTS, write_streamed
from tests.tiny import qwen2_gguf_writer

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN = 1, 256, 4, 2, 512  # K-quant rows are whole 256-element blocks
HEAD_DIM = HIDDEN // HEADS


def _quantized(rng: np.random.Generator, kind: str, rows: int, cols: int) -> tuple[np.ndarray, object]:
    """(raw blocks, ggml type): Q8_0 quantized from random weights; Q4_K/Q6_K random blocks with finite scales."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    if kind == "Q8_0":
        return gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype), qtype
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scales = (rng.uniform(0.001, 0.02, (rows, cols // block, 2))).astype(np.float16).view(np.uint8)
    if kind == "Q4_K":  # d, dmin first
        raw[..., :4] = scales
    else:  # Q6_K: d last
        raw[..., -2:] = scales[..., :2]
    return raw.reshape(rows, -1), qtype


def _write(path: Path, arch: str, *, tied: bool, name: str = "tiny") -> Path:
    rng = np.random.default_rng(7)
    w, vocab = qwen2_gguf_writer(path, name, layers=LAYERS, hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, ffn=FFN,
                                 arch=arch)
    kv = KV_HEADS * HEAD_DIM
    quantized = {"token_embd.weight": ("Q4_K", vocab, HIDDEN)}
    if not tied:
        quantized["output.weight"] = ("Q6_K", vocab, HIDDEN)
    plain: dict[str, np.ndarray] = {"output_norm.weight": rng.standard_normal(HIDDEN).astype(np.float32)}
    for i in range(LAYERS):
        b = f"blk.{i}."
        quantized |= {b + "attn_q.weight": ("Q8_0", HIDDEN, HIDDEN), b + "attn_k.weight": ("Q4_K", kv, HIDDEN),
                      b + "attn_v.weight": ("Q6_K", kv, HIDDEN), b + "ffn_gate.weight": ("Q4_K", FFN, HIDDEN),
                      b + "ffn_down.weight": ("Q6_K", HIDDEN, FFN)}
        plain |= {b + "attn_norm.weight": rng.standard_normal(HIDDEN).astype(np.float32),
                  b + "ffn_norm.weight": rng.standard_normal(HIDDEN).astype(np.float32),
                  b + "attn_output.weight": rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float16),
                  b + "ffn_up.weight": rng.standard_normal((FFN, HIDDEN)).astype(np.float32)}
        if arch == "qwen2":
            plain |= {b + "attn_q.bias": rng.standard_normal(HIDDEN).astype(np.float32),
                      b + "attn_k.bias": rng.standard_normal(kv).astype(np.float32),
                      b + "attn_v.bias": rng.standard_normal(kv).astype(np.float32)}
    for tensor_name, (kind, rows, cols) in quantized.items():
        raw, qtype = _quantized(rng, kind, rows, cols)
        w.add_tensor(tensor_name, raw, raw_shape=raw.shape, raw_dtype=qtype)
    for tensor_name, data in plain.items():
        w.add_tensor(tensor_name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(("arch", "tied"), [("qwen2", False), ("qwen2", True), ("llama", False)])
def test_streamed_equals_whole_model_save(arch: str, tied: bool, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = _write(tmp_path / f"{arch}.gguf", arch, tied=tied)
    save_whole(gguf, tmp_path / "whole", set())
    monkeypatch.setattr(gguf_stream, "ROWS", 7)  # chunk boundaries inside every quantized tensor
    assert write_streamed(gguf, tmp_path / "streamed") is not None
    whole, streamed = (tmp_path / d / WEIGHTS for d in ("whole", "streamed"))
    assert streamed.read_bytes() == whole.read_bytes()
    config = json.loads((tmp_path / "streamed" / "config.json").read_text())
    assert config == json.loads((tmp_path / "whole" / "config.json").read_text())
    assert (config["model_type"], config["tie_word_embeddings"]) == (arch, tied)


def test_llama_q_and_k_are_permuted_back(tmp_path: Path) -> None:
    """The byte comparison above would pass if both paths skipped llama's permutation: check it ran."""
    import torch
    from gguf import GGUFReader, dequantize
    from safetensors import safe_open

    gguf = _write(tmp_path / "llama.gguf", "llama", tied=True)
    write_streamed(gguf, tmp_path / "out")
    stored = {t.name: t for t in GGUFReader(str(gguf)).tensors}
    with safe_open(tmp_path / "out" / WEIGHTS, "pt") as f:
        k = f.get_tensor("model.layers.0.self_attn.k_proj.weight")
        v = f.get_tensor("model.layers.0.self_attn.v_proj.weight")
    raw_k = torch.from_numpy(dequantize(stored["blk.0.attn_k.weight"].data, stored["blk.0.attn_k.weight"].tensor_type))
    unpermuted = raw_k.reshape(KV_HEADS, HEAD_DIM // 2, 2, HIDDEN).transpose(1, 2).reshape(k.shape)
    assert torch.equal(k, unpermuted) and not torch.equal(k, raw_k)
    raw_v = dequantize(stored["blk.0.attn_v.weight"].data, stored["blk.0.attn_v.weight"].tensor_type)
    assert torch.equal(v, torch.from_numpy(raw_v))


def test_declines_what_it_does_not_cover(tmp_path: Path) -> None:
    """transformers reads a llama file whose general.name is "mistral" as a Mistral model: left to the whole path."""
    gguf = _write(tmp_path / "m.gguf", "llama", tied=True, name="mistral")
    assert write_streamed(gguf, tmp_path / "out") is None
    assert not (tmp_path / "out").exists()
