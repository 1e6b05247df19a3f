"""export_plain_graph: the ONNX graph, run by ONNX Runtime, matches the torch model for prefill and cached steps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from tiny import FAMILIES
from transformers import AutoModelForCausalLM, DynamicCache

from specpack import names
from specpack.errors import SpecpackError
from specpack.export.model_info import read_model_info
from specpack.export.torch_export import export_plain_graph

TOL = 1e-4


def _session(onnx_path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])


def _run(sess: ort.InferenceSession, num_layers: int, ids: np.ndarray, past: list[np.ndarray],
         mask: np.ndarray | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """One ONNX forward: ids [B, S] after `past` (each [B, H, L, D]) -> logits [B, S, V], presents."""
    batch, seq = ids.shape
    past_len = past[0].shape[2]
    feeds = {names.INPUT_IDS: ids,
             names.POSITION_IDS: np.tile(np.arange(past_len, past_len + seq, dtype=np.int64), (batch, 1)),
             names.ATTENTION_MASK: np.ones((batch, past_len + seq), np.int64) if mask is None else mask}
    feeds |= dict(zip(names.kv_names(num_layers, "past"), past, strict=True))
    logits, *present = sess.run([names.LOGITS, *names.kv_names(num_layers, "present")], feeds)
    return logits, present


def _empty_past(info, batch: int = 1, dtype=np.float32) -> list[np.ndarray]:
    return [np.zeros((batch, info.kv_heads, 0, info.head_dim), dtype) for _ in range(2 * info.num_layers)]


def _torch_presents(cache: DynamicCache) -> list[np.ndarray]:
    layers: list[Any] = list(cache.layers)
    return [t.numpy() for layer in layers for t in (layer.keys, layer.values)]


def _max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x.astype(np.float32) - y.astype(np.float32)).max()) for x, y in zip(a, b, strict=True))


def _check_prefill_then_step(model_dir: Path, onnx_path: Path) -> None:
    """Prefill (L=0, S=5), then a step (L=5, S=3) fed the graph's own presents; torch (sdpa, its own cache) is
    the reference for logits and presents, and a no-cache forward over all 8 tokens for the step's logits."""
    info = read_model_info(model_dir)
    sess = _session(onnx_path)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.randint(0, info.vocab_rows, (1, 8), generator=torch.Generator().manual_seed(0))  # [1, 8]

    logits, present = _run(sess, info.num_layers, ids[:, :5].numpy(), _empty_past(info))
    cache = DynamicCache()  # full layers: present = past + new, like the graph
    with torch.no_grad():
        ref = model(input_ids=ids[:, :5], cache=cache, use_cache=True).logits
    assert logits.shape == (1, 5, info.vocab_rows)
    assert present[0].shape == (1, info.kv_heads, 5, info.head_dim)
    assert _max_diff([logits, *present], [ref.numpy(), *_torch_presents(cache)]) < TOL

    logits, present = _run(sess, info.num_layers, ids[:, 5:].numpy(), present)
    with torch.no_grad():
        ref = model(input_ids=ids[:, 5:], cache=cache, use_cache=True).logits
        full = model(input_ids=ids).logits[:, 5:]  # [1, 3, V] without any cache
    assert logits.shape == (1, 3, info.vocab_rows)
    assert present[0].shape == (1, info.kv_heads, 8, info.head_dim)
    assert _max_diff([logits, *present], [ref.numpy(), *_torch_presents(cache)]) < TOL
    assert _max_diff([logits], [full.numpy()]) < TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_plain_graph_matches_torch(family: str, tiny_pairs, tiny_plain_graph) -> None:
    _, target = tiny_pairs(family)
    onnx_path = tiny_plain_graph(family)
    info = read_model_info(target)

    # contract: names in order, dynamic dims named, weights in exactly one data file next to the graph
    model = onnx.load(str(onnx_path), load_external_data=False)
    assert [i.name for i in model.graph.input] == [names.INPUT_IDS, names.POSITION_IDS, names.ATTENTION_MASK,
                                                   *names.kv_names(info.num_layers, "past")]
    assert [o.name for o in model.graph.output] == [names.LOGITS, *names.kv_names(info.num_layers, "present")]
    dims = [d.dim_param or d.dim_value for d in model.graph.input[3].type.tensor_type.shape.dim]
    assert dims == ["batch_size", info.kv_heads, "past_sequence_length", info.head_dim]
    assert sorted(p.name for p in onnx_path.parent.iterdir()) == [onnx_path.name, f"{onnx_path.name}.data"]
    locations = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {f"{onnx_path.name}.data"}

    _check_prefill_then_step(target, onnx_path)


def test_batch_of_two_with_left_padding(tiny_pairs, tiny_plain_graph) -> None:
    """Batch is dynamic: B=2 with row 0 left-padded by 2 matches torch on the real (unpadded) positions."""
    _, target = tiny_pairs("llama")
    info = read_model_info(target)
    sess = _session(tiny_plain_graph("llama"))
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    ids = torch.randint(0, info.vocab_rows, (2, 6), generator=torch.Generator().manual_seed(1))  # [2, 6]
    mask = torch.ones(2, 6, dtype=torch.int64)
    mask[0, :2] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [2, 6], padding at position 0
    feeds = {names.INPUT_IDS: ids.numpy(), names.POSITION_IDS: pos.numpy(), names.ATTENTION_MASK: mask.numpy()}
    feeds |= dict(zip(names.kv_names(info.num_layers, "past"), _empty_past(info, batch=2), strict=True))
    logits = sess.run([names.LOGITS], feeds)[0]  # [2, 6, V]
    with torch.no_grad():
        ref = model(input_ids=ids, position_ids=pos, attention_mask=mask).logits.numpy()
    assert np.abs(logits[0, 2:] - ref[0, 2:]).max() < TOL
    assert np.abs(logits[1] - ref[1]).max() < TOL


def test_sliding_window_cache_keeps_every_position(tiny_pairs, tmp_path: Path) -> None:
    """Mistral with a 4-token window: presents still grow to L+S (rollback = keep the first L), the mask applies
    the window, and the step's logits equal a no-cache forward."""
    draft, _ = tiny_pairs("mistral")  # one layer is enough here
    model_dir = Path(shutil.copytree(draft, tmp_path / "mistral-sw4"))
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "sliding_window": 4}))
    onnx_path = tmp_path / "sw4.onnx"
    export_plain_graph(model_dir, onnx_path)
    _check_prefill_then_step(model_dir, onnx_path)


def test_fp16_export(tiny_pairs, tiny_plain_graph) -> None:
    """fp16 graphs take and give fp16 caches and logits; ONNX Runtime CPU runs them close to fp32 torch."""
    draft, _ = tiny_pairs("qwen2")
    onnx_path = tiny_plain_graph("qwen2", role="draft", dtype="fp16")
    info = read_model_info(draft)
    model = onnx.load(str(onnx_path), load_external_data=False)
    fp16 = onnx.TensorProto.FLOAT16
    assert model.graph.output[0].type.tensor_type.elem_type == fp16
    assert all(i.type.tensor_type.elem_type == fp16 for i in model.graph.input[3:])

    ids = np.array([[5, 17, 42, 7, 99]], np.int64)
    logits, present = _run(_session(onnx_path), info.num_layers, ids, _empty_past(info, dtype=np.float16))
    assert logits.dtype == np.float16 and present[0].dtype == np.float16
    torch_model = AutoModelForCausalLM.from_pretrained(draft, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch_model(input_ids=torch.from_numpy(ids)).logits.numpy()
    assert np.abs(logits.astype(np.float32) - ref).max() < 0.05 * max(1.0, float(np.abs(ref).max()))


def test_invalid_dtype_lists_choices(tmp_path: Path) -> None:
    with pytest.raises(SpecpackError, match="fp8") as err:
        export_plain_graph(tmp_path, tmp_path / "x.onnx", dtype="fp8")
    assert "fp32, fp16, bf16" in str(err.value)


def test_missing_model_dir(tmp_path: Path) -> None:
    with pytest.raises(SpecpackError, match="does not exist"):
        export_plain_graph(tmp_path / "nope", tmp_path / "x.onnx")
    assert not (tmp_path / "x.onnx").exists()
