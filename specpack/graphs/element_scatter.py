"""Row writes by ScatterND rewritten to write one element per index, for ONNX Runtime's CUDA EP.

ONNX Runtime's CUDA ScatterND runs one thread per index, and each thread copies its index's slice in a serial loop
(onnxruntime/core/providers/cuda/tensor/scatter_nd_impl.cu). A cache write of S rows of W values is then S threads of
W serial copies: the head's features cache (2 rows of 4,608 fp16 a step) took 170 us of a 2.7 ms target step on an
H100 (bench/README.md, "Run H"), where S x W threads of one copy each take a few. The rewrite keeps the ScatterND, so
the in-place contract stays (data and output one buffer: static_attention.py), and only widens its indices:

    ScatterND(data [..., W] (rank r), indices [..., r - 1], updates [..., W])
      -> indices [..., W, r] = (the row's index, w) for w in 0 .. W - 1:
         Concat(Expand(Unsqueeze(indices, -2), [..., W, r - 1]), Expand(Range(W) as [W, 1], [..., W, 1]), axis -1)

Only writes of whole last-dimension rows (indices' last dimension r - 1, as every cache write of the graphs the cuda
backend opens: the static form's KV caches, the features cache, kv_compact.onnx) are rewritten; others stay. The shapes enter
through Shape and Range, host values on every EP, as the writes themselves build their indices. The indices take
S x W x r int64: 295 KB for the features of a 2-row step, S x 147 KB for a longer run (an uncaptured prefill of S
rows holds them while it runs). The cuda backend applies it to every graph it opens (backends/cuda.py); the cpu
backend's ScatterND copies slices with memcpy and keeps the graphs as exported.
"""

from __future__ import annotations

import onnx
from onnx import shape_inference

from specpack.graphs.onnx_builder import GraphBuilder

PREFIX = "specpack/element_scatter/"


def element_scatter(model: onnx.ModelProto) -> int:
    """Rewrite, in place, every ScatterND of `model`'s main graph that writes whole last-dimension rows; returns how
    many were rewritten."""
    ranks = _ranks(model)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    b = GraphBuilder(opset, prefix=PREFIX)
    nodes: list[onnx.NodeProto] = []
    rewritten = 0
    for node in model.graph.node:
        if node.op_type == "ScatterND":
            data, indices, updates = node.input[:3]
            # whole last-dimension rows: indices [q + 1] address rank - 1 dimensions exactly when the updates, [q] +
            # the slice's shape, have the indices' rank (a slice of one dimension)
            if ranks.get(data, 0) >= 2 and ranks.get(indices) is not None and ranks.get(updates) == ranks[indices]:
                mark = len(b.nodes)
                node.input[1] = _widened(b, data, indices)
                nodes.extend(b.nodes[mark:])
                rewritten += 1
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return rewritten


def element_scatter_bytes(model: bytes) -> bytes:
    """element_scatter over a serialized model (weights external, not loaded), serialized again."""
    proto = onnx.load_from_string(model)
    return proto.SerializeToString() if element_scatter(proto) else model


def _widened(b: GraphBuilder, data: str, indices: str) -> str:
    """indices [..., r - 1] of rows of `data` -> [..., W, r]: each row's index with every column w appended."""
    width = b.op("Shape", data, start=-1)                      # [1] W
    lead = b.op("Shape", indices, start=0, end=-1)            # [q] the indices' leading shape
    depth = b.op("Shape", indices, start=-1)                  # [1] r - 1
    rows = b.op("Expand", b.op("Unsqueeze", indices, b.const([-2])), b.op("Concat", lead, width, depth, axis=0))
    column = b.op("Range", b.const(0), b.op("Squeeze", width, b.const([0])), b.const(1))  # [W]
    column = b.op("Reshape", column, b.const([-1, 1]))                                     # [W, 1]
    columns = b.op("Expand", column, b.op("Concat", lead, width, b.const([1]), axis=0))   # [..., W, 1]
    return str(b.op("Concat", rows, columns, axis=-1))                                    # [..., W, r]


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    """Every value's rank that shape inference over the graph's structure (no weights) knows: ranks are static in
    the packs' cache writes even where their sizes are data (the indices' last dimension comes out of a Concat of
    Expands over computed shapes)."""
    inferred = shape_inference.infer_shapes(model)
    ranks: dict[str, int] = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            ranks[value.name] = len(tensor.shape.dim)
    return ranks
