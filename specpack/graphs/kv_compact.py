"""kv_compact.onnx: after a tree verify, move the accepted path's cache rows into place (static KV cache, in place).

A tree verify writes its T + 1 rows (root, then node i at row i + 1) into cache rows R .. R + T in node order,
R the root's cache row. The accepted path (the tree head's `path`: 0, then node + 1 per accepted node, -1 padded)
must end up as a chain, rows R .. R + n; every other row past R + n is dropped by the length update that follows.
Fixed shapes (T + 1 rows moved every time, the padding onto itself), the indices as data, no If / Loop: one
CUDA-graph capture per tree size. Bound like the verify's cache: each present.* onto its past_key_values.* buffer.

    attention_mask  int64 [1, M]            the mask the verify ran with: ones at [0, R + T + 1)
    path            int64 [1, T+1]          the verify's output, unchanged
    past_key_values.{i}.key|value  [1, Hkv, M, D]   (the verify's present buffers)
    -> present.{i}.key|value       [1, Hkv, M, D]   the same buffers: rows R + d <- rows R + path[d], d <= n
    a head pack's (feature_dim F > 0) features cache too, the same rows moved:
    past_target_features [1, 1, M, F] -> target_features [1, 1, M, F]   (bound in place like the KV cache)

        R    = ReduceSum(attention_mask) - (T + 1)                      [1]    the root's cache row (T + 1 through
                                                                               GraphBuilder.shape_value: on the device)
        d    = Range(0, T + 1)                                          [T+1]  (a Range over shapes: on the device)
        src  = R + (path >= 0 ? path : d)                               [T+1]  padding: a row onto itself
        dst  = R + d                                                    [T+1]
        idx  = (0, h, dst[t]) for h < Hkv, t <= T (broadcast)           [1, Hkv, T+1, 3]
        per cache tensor:  present = ScatterND(past, idx, Gather(past, src, axis=2))

Every source is read (Gather) before anything is written (ScatterND depends on it), and the destinations are
distinct, so the result does not depend on the order rows are written in; path[d] >= d (topological order), so no
row is written before it is read even by a kernel that streamed. ONNX Runtime's ScatterND writes in place when
its data input and output are one buffer (docs/static_kv_cache.md). A chain's path (0, 1, .., n, -1 ..) moves
nothing: the runtime may skip the call then.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from specpack import names
from specpack.graphs.onnx_builder import INT64, GraphBuilder, Value, tensor_info

_ELEM_TYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
# dim_params (the verify's: torch_export.MAX; the path's as in tree_head.tree_verify_head_io)
MAX, PATH_ROWS = "max_sequence_length", "T_plus_1"


def kv_compact_model(num_layers: int, kv_heads: int, head_dim: int, dtype: str = "fp32", opset: int = 18,
                     feature_dim: int = 0) -> onnx.ModelProto:
    """The compaction graph for a static cache of `num_layers` layers of [1, kv_heads, M, head_dim] (module docstring);
    feature_dim > 0: a head pack's features cache past_target_features -> target_features [1, 1, M, F] too."""
    b = GraphBuilder(opset)
    rows = b.op("Shape", names.PATH, start=1, end=2)  # [1] T + 1, a host value
    total = b.reduce("ReduceSum", names.ATTENTION_MASK, axis=1, keepdims=False)  # [1] R + T + 1
    root = b.op("Sub", total, b.shape_value(rows))  # [1] R
    step = b.op("Range", b.const(0), b.op("Squeeze", rows, b.const([0])), b.const(1))  # [T+1] d
    path = b.op("Squeeze", names.PATH, b.const([0]))  # [T+1]
    source = b.op("Add", root, b.op("Where", b.op("Less", path, b.const(0)), step, path))  # [T+1] R + path[d]
    dst = b.op("Add", root, step)  # [T+1] R + d
    indices = _row_indices(b, dst, kv_heads)  # [1, Hkv, T+1, 3] (0, h, R + d)
    pairs = list(zip(names.kv_names(num_layers, "past"), names.kv_names(num_layers, "present"), strict=True))
    for past, present in pairs:
        _move_rows(b, past, present, source, indices)
    elem = _ELEM_TYPES[dtype]
    kv: list[int | str] = [1, kv_heads, MAX, head_dim]
    inputs = [tensor_info(names.ATTENTION_MASK, INT64, [1, MAX]), tensor_info(names.PATH, INT64, [1, PATH_ROWS]),
              *(tensor_info(past, elem, kv) for past, _ in pairs)]
    outputs = [tensor_info(present, elem, kv) for _, present in pairs]
    if feature_dim:  # the features cache: one more tensor of one "head", F wide
        _move_rows(b, names.PAST_TARGET_FEATURES, names.TARGET_FEATURES, source, _row_indices(b, dst, 1))
        features: list[int | str] = [1, 1, MAX, feature_dim]
        inputs.append(tensor_info(names.PAST_TARGET_FEATURES, elem, features))
        outputs.append(tensor_info(names.TARGET_FEATURES, elem, features))
    model = helper.make_model(helper.make_graph(b.nodes, "kv_compact", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", opset)], producer_name="specpack")
    model.ir_version = min(model.ir_version, 10)  # what onnxruntime >= 1.20 reads
    onnx.checker.check_model(model)
    return model


def write_kv_compact(out: Path, num_layers: int, kv_heads: int, head_dim: int, dtype: str = "fp32",
                     feature_dim: int = 0) -> Path:
    """kv_compact.onnx for one model's cache geometry (and a head pack's features cache), written to `out`."""
    onnx.save_model(kv_compact_model(num_layers, kv_heads, head_dim, dtype, feature_dim=feature_dim), str(out))
    return out


def _move_rows(b: GraphBuilder, past: str, present: str, source: Value, indices: Value) -> None:
    """present = ScatterND(past, indices, Gather(past, source, axis=2)): rows source[d] -> the indices' rows."""
    moved = b.op("Gather", past, source, axis=2)  # [1, H, T+1, D]
    b.op("ScatterND", past, indices, moved)
    b.nodes[-1].output[0] = present


def _row_indices(b: GraphBuilder, dst: Value, kv_heads: int) -> Value:
    """ScatterND indices (0, h, dst[t]) for every head h and row t: dst int64 [N] -> [1, kv_heads, N, 3], by
    broadcasting (device data only, no shape arithmetic)."""
    row = b.op("Reshape", dst, b.const([1, 1, -1, 1]))  # [1, 1, N, 1]
    heads = b.op("Add", b.op("Mul", row, b.const(0)), b.const(np.arange(kv_heads).reshape(1, -1, 1, 1)))  # [1, Hkv, N, 1]
    zeros = b.op("Mul", heads, b.const(0))  # [1, Hkv, N, 1]
    return b.op("Concat", zeros, heads, b.op("Add", zeros, row), axis=-1)
