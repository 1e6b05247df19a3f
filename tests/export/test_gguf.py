"""convert_gguf on a tiny Qwen2 GGUF built here (F32, F16 and Q8_0 tensors, a byte-level BPE tokenizer)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specpack.errors import SpecpackError
from specpack.export.gguf import RECORD, cache_key, convert_gguf, read_gguf_summary
from tests.tiny import CHATML_TEMPLATE, qwen2_gguf_writer

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN = 2, 64, 4, 2, 128
HEAD_DIM = HIDDEN // HEADS
PROMPT = "def add(a, b):\n    return a + b<|im_end|>"


def _tensors(vocab: int) -> dict[str, np.ndarray]:
    """Qwen2 weights under their GGUF names, in HF layout [out, in] (GGUFWriter reverses the dims)."""
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    t = {"token_embd.weight": w(vocab, HIDDEN), "output_norm.weight": 1 + w(HIDDEN), "output.weight": w(vocab, HIDDEN)}
    for i in range(LAYERS):
        b = f"blk.{i}."
        t |= {b + "attn_norm.weight": 1 + w(HIDDEN), b + "ffn_norm.weight": 1 + w(HIDDEN),
              b + "attn_q.weight": w(HIDDEN, HIDDEN), b + "attn_q.bias": w(HIDDEN),
              b + "attn_k.weight": w(KV_HEADS * HEAD_DIM, HIDDEN), b + "attn_k.bias": w(KV_HEADS * HEAD_DIM),
              b + "attn_v.weight": w(KV_HEADS * HEAD_DIM, HIDDEN), b + "attn_v.bias": w(KV_HEADS * HEAD_DIM),
              b + "attn_output.weight": w(HIDDEN, HIDDEN),
              b + "ffn_gate.weight": w(FFN, HIDDEN), b + "ffn_up.weight": w(FFN, HIDDEN),
              b + "ffn_down.weight": w(HIDDEN, FFN)}
    return t


def write_tiny_gguf(path: Path) -> dict[str, np.ndarray]:
    """A loadable Qwen2 GGUF: 1-D tensors F32, attention Q8_0, the rest F16. Returns the fp32 originals."""
    import gguf

    w, n_tokens = qwen2_gguf_writer(path, "tiny qwen2", layers=LAYERS, hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS,
                                   ffn=FFN)
    tensors = _tensors(n_tokens)
    for name, data in tensors.items():
        if data.ndim == 1:
            w.add_tensor(name, data)
        elif ".attn_" in name:
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, data.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("gguf") / "tiny-qwen2.Q8_0.gguf"
    return path, write_tiny_gguf(path)


@pytest.fixture(scope="module")
def converted(tiny_gguf: tuple[Path, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert_gguf(tiny_gguf[0], tmp_path_factory.mktemp("converted"))


def _logits(model: Any, tokenizer: Any) -> Any:
    import torch

    with torch.no_grad():
        return model(**tokenizer(PROMPT, return_tensors="pt")).logits


def test_converted_dir_is_a_plain_fp32_model(converted: Path, tiny_gguf: tuple[Path, dict[str, np.ndarray]]) -> None:
    import torch
    from safetensors import safe_open

    files = {p.name for p in converted.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", RECORD} <= files
    with safe_open(converted / "model.safetensors", "pt") as f:
        names = list(f.keys())
        assert {f.get_slice(k).get_dtype() for k in names} == {"F32"}
        norm = f.get_tensor("model.layers.1.input_layernorm.weight")
    assert torch.equal(norm, torch.from_numpy(tiny_gguf[1]["blk.1.attn_norm.weight"]))  # F32 kept exactly
    assert "quantization_config" not in json.loads((converted / "config.json").read_text())
    record = json.loads((converted / RECORD).read_text())
    assert record["architecture"] == "qwen2" and record["size"] == tiny_gguf[0].stat().st_size


def test_converted_model_matches_gguf_load(converted: Path, tiny_gguf: tuple[Path, dict[str, np.ndarray]]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, originals = tiny_gguf
    model = AutoModelForCausalLM.from_pretrained(converted)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    ref = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    tok, ref_tok = AutoTokenizer.from_pretrained(converted), AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    assert tok(PROMPT)["input_ids"] == ref_tok(PROMPT)["input_ids"]
    torch.testing.assert_close(_logits(model, tok), _logits(ref, ref_tok), rtol=0, atol=1e-5)
    q = model.model.layers[0].self_attn.q_proj.weight  # Q8_0: within half a quantization step of the original
    assert (q - torch.from_numpy(originals["blk.0.attn_q.weight"])).abs().max() < 0.01


def test_tokenizer_keeps_chat_template_and_end_ids(converted: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted)
    assert tok.chat_template == CHATML_TEMPLATE
    assert tok.eos_token == "<|im_end|>"
    ids = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    generation = json.loads((converted / "generation_config.json").read_text())
    assert generation["eos_token_id"] == ids  # the file's eos first, then <|endoftext|>
    assert json.loads((converted / "config.json").read_text())["eos_token_id"] == ids[0]


def test_second_call_is_cached(converted: Path, tiny_gguf: tuple[Path, Any]) -> None:
    start = time.perf_counter()
    again = convert_gguf(tiny_gguf[0], converted.parent)
    assert again == converted and time.perf_counter() - start < 0.5
    assert [p.name for p in converted.parent.iterdir()] == [converted.name]  # no temporary left


def test_cache_key_follows_name_size_and_mtime(tmp_path: Path) -> None:
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"GGUF" + bytes(60))
    b.write_bytes(b"GGUF" + bytes(60))
    os.utime(b, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns))
    key = cache_key(a)
    assert key.startswith("a-") and key == cache_key(a)
    assert cache_key(b) != key  # another name
    os.utime(a, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns + 1_000_000_000))
    assert cache_key(a) != key  # touched
    odd = tmp_path / "Qwen 2.5 (copy).Q4_K_M.gguf"
    odd.write_bytes(b"GGUF")
    assert cache_key(odd).startswith("qwen-2.5-copy-.q4_k_m-")  # lower case, no blanks or brackets


def test_not_a_gguf_file(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(SpecpackError, match="is not a GGUF file") as err:
        convert_gguf(bad, tmp_path / "cache")
    assert "b'GGUF'" in str(err.value)
    assert not (tmp_path / "cache").exists()


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecpackError, match="does not exist"):
        convert_gguf(tmp_path / "nope.gguf", tmp_path / "cache")


@pytest.mark.parametrize(("keep", "message"), [
    (0, "not a GGUF file"), (3, "not a GGUF file"),  # no room for the magic
    (24, "damaged or incomplete"), (200, "damaged or incomplete"),  # cut inside the metadata
    (-100, "damaged or incomplete"),  # cut inside the tensor data
])
def test_truncated_file(tiny_gguf: tuple[Path, Any], tmp_path: Path, keep: int, message: str) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf[0].read_bytes()[:keep])
    with pytest.raises(SpecpackError, match=message):
        convert_gguf(cut, tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_summary_of_tiny_file(tiny_gguf: tuple[Path, dict[str, np.ndarray]]) -> None:
    summary = read_gguf_summary(tiny_gguf[0])
    assert (summary.version, summary.architecture, summary.tensor_count) == (3, "qwen2", len(tiny_gguf[1]))
    assert summary.data_end <= summary.file_size


def test_failed_conversion_leaves_nothing(tiny_gguf: tuple[Path, Any], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import specpack.export.gguf as mod

    def broken(*args: Any, **kwargs: Any) -> None:
        raise SpecpackError("boom")

    monkeypatch.setattr(mod, "write_streamed", broken)  # fails after the tokenizer is written
    with pytest.raises(SpecpackError, match="boom"):
        convert_gguf(tiny_gguf[0], tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_missing_packages_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    with pytest.raises(SpecpackError, match="missing: accelerate") as err:
        convert_gguf(tmp_path / "any.gguf", tmp_path / "cache")
    assert "specpack[export]" in str(err.value)


def test_packed_weights_are_refused() -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from specpack.export.gguf import _check_plain_fp32

    config = Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    model = Qwen2ForCausalLM(config)
    _check_plain_fp32(model)
    proj = model.model.layers[0].mlp.down_proj
    proj.weight = torch.nn.Parameter(torch.zeros(16, 18, dtype=torch.uint8), requires_grad=False)  # "blocks"
    with pytest.raises(SpecpackError, match="plain fp32") as err:
        _check_plain_fp32(model)
    assert "mlp.down_proj.weight" in str(err.value)
