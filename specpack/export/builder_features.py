"""The features a draft head reads, added to a model builder graph (`spec-export --graphs builder --draft-head`).

    builder graph (renamed to our contract)  --+ past_target_features [1, 1, M, F] in
                                                + target_features      [1, 1, M, F] out (the same buffer, in place)

The head reads transformers' hidden_states[i] for each tapped layer i: the residual stream entering layer i
(heads/model.py). In the builder's graph that stream is a named value:

    i = 0    the input of /model/layers.0/input_layernorm (a SimplifiedLayerNormalization): the embedding's output
    i > 0    output 3 of /model/layers.i/input_layernorm (a SkipSimplifiedLayerNormalization): input + skip, the
             residual stream the builder already carries to the next norm

Their concatenation [1, S, F] is written at rows [L, L + S) of the features cache, L = ReduceSum(attention_mask) - S
(the static contract: the mask covers the committed tokens and this run's), exactly as the torch static form's
`kv_write` does (export/static_attention.py): the shape value S enters the data only through a Range over shapes,
so ONNX Runtime's CUDA EP computes it on the device (no host copy mid-graph, which would refuse CUDA graphs).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specpack import names
from specpack.errors import SpecpackError
from specpack.graphs.onnx_builder import GraphBuilder, Value

if TYPE_CHECKING:
    from collections.abc import Sequence

    import onnx

LAYER_NORM = "/model/layers.{}/input_layernorm/"  # the builder's node name prefix of layer i's input norm


def add_features_cache(plain: Path, taps: tuple[int, ...], hidden: int) -> None:
    """Rewrite the builder graph at `plain` (weights stay in its data file) to take and return the features cache
    of the `taps` layers' inputs, each `hidden` wide."""
    import onnx

    model = onnx.load(str(plain), load_external_data=False)
    graph = model.graph
    streams = [_residual_stream(graph, layer) for layer in taps]
    mask = next(i for i in graph.input if i.name == names.ATTENTION_MASK)
    logits = next(o for o in graph.output if o.name == names.LOGITS)
    dtype = logits.type.tensor_type.elem_type  # the io dtype: the residual stream's
    max_dim = mask.type.tensor_type.shape.dim[1]
    max_len = max_dim.dim_param or max_dim.dim_value

    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    b = GraphBuilder(opset, prefix="specpack/features/")
    features = streams[0] if len(streams) == 1 else b.op("Concat", *streams, axis=-1)  # [1, S, F]
    new = b.op("Unsqueeze", features, b.const([1]))  # [1, 1, S, F]
    seq = b.op("Shape", names.INPUT_IDS, start=1, end=2)  # [1] S (a shape: a host value on every EP)
    total = b.op("ReduceSum", names.ATTENTION_MASK, b.const([1]), keepdims=0)  # [1] L + S, on the device
    start = b.op("Sub", total, b.shape_value(seq))  # [1] L
    indices = _row_indices(b, new, start)
    # the graph output is the ScatterND's own (no Identity after it): bound onto the input's buffer, ONNX Runtime's
    # ScatterND then skips copying the cache and writes the S rows in place
    graph.node.extend([*b.nodes, onnx.helper.make_node("ScatterND", [names.PAST_TARGET_FEATURES, indices, new],
                                                       [names.TARGET_FEATURES], name="specpack/features/write")])
    cache_shape = [1, 1, max_len, hidden * len(taps)]
    graph.input.insert(_after(graph.input, names.ATTENTION_MASK),
                       onnx.helper.make_tensor_value_info(names.PAST_TARGET_FEATURES, dtype, cache_shape))
    graph.output.insert(_after(graph.output, names.LOGITS),
                        onnx.helper.make_tensor_value_info(names.TARGET_FEATURES, dtype, cache_shape))
    onnx.save_model(model, str(plain))


def _residual_stream(graph: onnx.GraphProto, layer: int) -> str:
    """The value holding hidden_states[layer] in the builder's graph (the module docstring's rule)."""
    prefix = LAYER_NORM.format(layer)
    node = next((n for n in graph.node if n.name.startswith(prefix)), None)
    if node is not None and node.op_type == "SimplifiedLayerNormalization":
        return str(node.input[0])
    if node is not None and node.op_type == "SkipSimplifiedLayerNormalization" and len(node.output) > 3 \
            and node.output[3]:
        return str(node.output[3])
    raise SpecpackError(f"the model builder's graph has no residual stream for tapped layer {layer}",
                        expected=f"a {prefix}* SimplifiedLayerNormalization (layer 0) or a SkipSimplified"
                                 "LayerNormalization with its input + skip output (layers > 0)",
                        found=f"{node.op_type} {node.name}" if node is not None else "no such node",
                        hint="export this head pack with --graphs torch")


def _row_indices(b: GraphBuilder, new: Value, start: Value) -> Value:
    """ScatterND indices [1, 1, S, 3] = (0, 0, start + s) for the rows of `new` [1, 1, S, F]."""
    seq = b.op("Shape", new, start=2, end=3)  # [1]
    one, zero = b.const([1]), b.const([0])
    grid = b.op("Concat", one, one, seq, one, axis=0)  # [1, 1, S, 1]
    rows = b.op("Add", b.op("Range", b.const(0), b.op("Squeeze", seq, zero), b.const(1)), start)  # [S] L + s
    rows = b.op("Reshape", rows, b.const(np.array([1, 1, -1, 1])))
    zeros = b.op("Expand", zero, grid)
    return b.op("Concat", zeros, zeros, b.op("Expand", rows, grid), axis=-1)


def _after(values: Sequence[onnx.ValueInfoProto], name: str) -> int:
    """The index just after the value called `name` in a graph's inputs or outputs."""
    return next(i for i, v in enumerate(values) if v.name == name) + 1
