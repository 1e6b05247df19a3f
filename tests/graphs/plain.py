"""A tiny plain forward graph with the export/ contract's names, built with onnx.helper (no torch).

    h = Gather(E, input_ids) + Gather(P, position_ids)                [B, S, H]
    logits = MatMul(h, W)                                             [B, S, V_model]
    present.{i}.key|value = Concat(past.{i}.key|value, heads(h) * (i + 1))   [B, kv, L + S, hd]

Weights go to one external-data file `<name>.data` (small tensors stay inline), as torch.onnx.export writes them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from specpack import names

KV_HEADS, HEAD_DIM, MAX_POSITIONS = 2, 4, 64


def make_plain(path: Path, model_vocab: int, *, layers: int = 2, dtype: type = np.float32, opset: int = 18,
               symbolic_vocab: bool = False, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    hidden = KV_HEADS * HEAD_DIM
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    weights = {
        "embed": rng.standard_normal((model_vocab, hidden)),
        "positions": rng.standard_normal((MAX_POSITIONS, hidden)) * 0.1,
        "lm_head": rng.standard_normal((hidden, model_vocab)),
    }
    nodes = [
        helper.make_node("Gather", ["embed", names.INPUT_IDS], ["tok"]),
        helper.make_node("Gather", ["positions", names.POSITION_IDS], ["pos"]),
        helper.make_node("Add", ["tok", "pos"], ["h"]),
        helper.make_node("MatMul", ["h", "lm_head"], [names.LOGITS]),
        helper.make_node("Reshape", ["h", "heads_shape"], ["h4"]),
        helper.make_node("Transpose", ["h4"], ["kv"], perm=[0, 2, 1, 3]),
    ]
    kv_shape: list[str | int] = ["batch", KV_HEADS, "past", HEAD_DIM]
    inputs = [helper.make_tensor_value_info(names.INPUT_IDS, TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info(names.POSITION_IDS, TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info(names.ATTENTION_MASK, TensorProto.INT64, ["batch", "total"])]
    logits_shape: list[str | int] = ["batch", "seq", "vocab" if symbolic_vocab else model_vocab]
    outputs = [helper.make_tensor_value_info(names.LOGITS, elem, logits_shape)]
    for i in range(layers):
        scale = f"scale_{i}"
        weights[scale] = np.array(i + 1.0)
        nodes.append(helper.make_node("Mul", ["kv", scale], [f"kv_{i}"]))
        for past, present in zip(names.kv_names(layers, "past")[2 * i : 2 * i + 2],
                                 names.kv_names(layers, "present")[2 * i : 2 * i + 2], strict=True):
            nodes.append(helper.make_node("Concat", [past, f"kv_{i}"], [present], axis=2))
            inputs.append(helper.make_tensor_value_info(past, elem, kv_shape))
            outputs.append(helper.make_tensor_value_info(present, elem, ["batch", KV_HEADS, "total", HEAD_DIM]))
    initializers = [numpy_helper.from_array(w.astype(dtype), n) for n, w in weights.items()]
    initializers.append(numpy_helper.from_array(np.array([0, 0, KV_HEADS, HEAD_DIM], np.int64), "heads_shape"))
    graph = helper.make_graph(nodes, "plain", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{path.name}.data", size_threshold=1024)
    return path


def plain_feeds(rng: np.random.Generator, seq: int, past: int, model_vocab: int, layers: int = 2,
                dtype: type = np.float32) -> dict[str, np.ndarray]:
    feeds = {names.INPUT_IDS: rng.integers(0, model_vocab, (1, seq)),
             names.POSITION_IDS: np.arange(past, past + seq)[None],
             names.ATTENTION_MASK: np.ones((1, past + seq), np.int64)}
    for name in names.kv_names(layers, "past"):
        feeds[name] = rng.standard_normal((1, KV_HEADS, past, HEAD_DIM)).astype(dtype)
    return feeds


def copy_plain(source: Path, dst: Path) -> Path:
    """A copy of a plain graph and its data file (build_* moves the data file), pointed at the copy's file."""
    model = onnx.load(str(source), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                shutil.copy(source.parent / entry.value, dst.with_name(f"{dst.name}.data"))
                entry.value = f"{dst.name}.data"
    onnx.save_model(model, str(dst))
    return dst
