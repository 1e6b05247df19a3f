"""Replace a weight site (sites.py) by its block-quantized form: ONNX Runtime contrib ops, domain com.microsoft.

    matmul     y = MatMul(x, W)                    ->  y = MatMulNBits(x, B, scales[, zero_points])
    embedding  e = Gather(E, input_ids)            ->  e = GatherBlockQuantized(B [V, H*bits/8], ids, scales[, zp])
    tied       e = Gather(E, ids); y = MatMul(x, Transpose(E))
               ->  y = MatMulNBits(x, B, scales[, zp])
                   e = Reshape(GatherBlockQuantized(B, ids, scales3, zp3), [.., H])   B [V, H/bs, bs*bits/8] shared

With mins (GGUF's scale-and-min formats, BlockQuant.mins), W = W_q - M, M constant within each block:
x @ W = x @ W_q - blocksum(x) @ mins, where blocksum(x) [.., K/bs] sums x over each block:

    x ─┬─ MatMulNBits(B, scales, zero_points 0) ─────────────────────────────── Sub ─> y
       └─ Reshape [.., K/bs, bs] ─ ReduceSum(-1) ─ MatMul(mins^T [K/bs, N]) ───┘
    ids ─┬─ GatherBlockQuantized ─ Reshape [.., H/bs, bs] ──────────────── Sub ─ Reshape [.., H] ─> e
         └─ Gather(mins [V, H/bs]) ─ Unsqueeze(-1) ─────────────────────────┘

so the dequantized weight is exactly (q - zp) * scale - min. B, scales and zero points use MatMulNBits'
layout (nbits.py); GatherBlockQuantized reads the same bytes with the table's rows as W's columns.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from specpack.quantize.external_data import DataFileWriter
from specpack.quantize.nbits import BlockQuant
from specpack.quantize.sites import Site

MS_DOMAIN = "com.microsoft"


class GraphEdit:
    """New nodes and initializers for one graph; `nodes_for` gives the nodes that replace a site's node."""

    def __init__(self, graph: onnx.GraphProto, writer: DataFileWriter, float_type: int) -> None:
        self.graph, self.writer = graph, writer
        self.np_float = onnx.helper.tensor_dtype_to_np_dtype(float_type)
        self.initializers: list[TensorProto] = []

    def _init(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(self.writer.tensor(name, array))
        return name

    def _const(self, name: str, values: list[int]) -> str:
        self.initializers.append(onnx.numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def matmul(self, site: Site, bq: BlockQuant, accuracy_level: int, packed_name: str | None = None) -> list[onnx.NodeProto]:
        """Nodes computing the MatMul of site.node with `bq`; `packed_name`: B already written (tied)."""
        old = self.graph.node[site.node]
        x, y = old.input[0], old.output[0]
        t = site.tensor
        b = packed_name or self._init(f"{t}.nbits{bq.bits}", bq.packed)
        inputs = [x, b, self._init(f"{t}.scales", bq.scales.astype(self.np_float))]
        if bq.zero_points is not None:
            inputs.append(self._init(f"{t}.zero_points", bq.zero_points))
        name = old.name or y
        attrs: dict[str, Any] = {"K": bq.k, "N": bq.n, "bits": bq.bits, "block_size": bq.block_size}
        if accuracy_level:
            attrs["accuracy_level"] = accuracy_level
        if bq.mins is None:
            return [helper.make_node("MatMulNBits", inputs, [y], name=f"{name}.nbits", domain=MS_DOMAIN, **attrs)]
        # y = MatMulNBits(x) - blocksum(x) @ mins^T
        blocks = bq.k // bq.block_size
        nodes = [
            helper.make_node("MatMulNBits", inputs, [f"{y}.wq"], name=f"{name}.nbits", domain=MS_DOMAIN, **attrs),
            helper.make_node("Reshape", [x, self._const(f"{t}.block_shape", [0, 0, blocks, bq.block_size])],
                             [f"{y}.xblocks"], name=f"{name}.xblocks"),  # [B, S, K/bs, bs]
            helper.make_node("ReduceSum", [f"{y}.xblocks", self._const(f"{t}.last_axis", [-1])], [f"{y}.xsum"],
                             name=f"{name}.xsum", keepdims=0),  # [B, S, K/bs]
            helper.make_node("MatMul", [f"{y}.xsum", self._init(f"{t}.mins", np.ascontiguousarray(
                bq.mins.T.astype(self.np_float)))], [f"{y}.min"], name=f"{name}.min"),  # [B, S, N]
            helper.make_node("Sub", [f"{y}.wq", f"{y}.min"], [y], name=f"{name}.sub"),
        ]
        return nodes

    def embedding(self, site: Site, bq: BlockQuant, shared: bool = False) -> tuple[list[onnx.NodeProto], str]:
        """Nodes computing the Gather of site.node from `bq`; returns them and the name of the packed table.

        shared: the table is written in MatMulNBits' 3-D layout, so a tied lm_head can read it too.
        """
        old = self.graph.node[site.node]
        ids, e = old.input[1], old.output[0]
        t, name = site.tensor, old.name or e
        blocks = bq.k // bq.block_size
        attrs: dict[str, Any] = {"bits": bq.bits, "block_size": bq.block_size, "gather_axis": 0}
        packed = self._init(f"{t}.nbits{bq.bits}", bq.packed if shared else bq.packed.reshape(bq.n, -1))
        if shared:  # data [V, H/bs, blob], scales / zero points [V, H/bs, 1]: quantized along the last axis
            scales = self._init(f"{t}.gather_scales", bq.scales.astype(self.np_float)[..., None])
            zp = None if bq.zero_points is None else self._init(f"{t}.gather_zero_points", _zero_points_3d(bq))
            attrs["quantize_axis"] = 2
        else:
            scales = self._init(f"{t}.scales", bq.scales.astype(self.np_float))
            zp = None if bq.zero_points is None else self._init(f"{t}.zero_points", bq.zero_points)
            attrs["quantize_axis"] = 1
        inputs = [packed, ids, scales, *([zp] if zp is not None else [])]
        if bq.mins is None and not shared:
            return [helper.make_node("GatherBlockQuantized", inputs, [e], name=f"{name}.nbits", domain=MS_DOMAIN,
                                     **attrs)], packed
        blocked = f"{e}.blocks"  # [B, S, H/bs, bs]
        nodes = [helper.make_node("GatherBlockQuantized", inputs, [f"{e}.gathered"], name=f"{name}.nbits",
                                  domain=MS_DOMAIN, **attrs)]
        if not shared:
            nodes.append(helper.make_node("Reshape", [f"{e}.gathered", self._const(
                f"{t}.row_blocks", [0, 0, blocks, bq.block_size])], [blocked], name=f"{name}.blocks"))
        else:
            nodes.append(helper.make_node("Identity", [f"{e}.gathered"], [blocked], name=f"{name}.blocks"))
        if bq.mins is not None:
            mins = self._init(f"{t}.row_mins", bq.mins.astype(self.np_float))  # [V, H/bs]
            nodes += [
                helper.make_node("Gather", [mins, ids], [f"{e}.min"], name=f"{name}.min"),  # [B, S, H/bs]
                helper.make_node("Unsqueeze", [f"{e}.min", self._const(f"{t}.last_axis_e", [-1])],
                                 [f"{e}.min1"], name=f"{name}.min1"),
                helper.make_node("Sub", [blocked, f"{e}.min1"], [f"{e}.blocks_min"], name=f"{name}.sub"),
            ]
            blocked = f"{e}.blocks_min"
        nodes.append(helper.make_node("Reshape", [blocked, self._const(f"{t}.row_shape", [0, 0, bq.k])], [e],
                                      name=f"{name}.rows"))
        return nodes, packed


def _zero_points_3d(bq: BlockQuant) -> np.ndarray:
    """Zero points [V, H/bs, 1] for GatherBlockQuantized on 3-D data (one packed byte per block)."""
    values = bq.zero_point_values()  # [V, H/bs]
    return values[..., None].astype(np.uint8)


def float_type_of(graph: onnx.GraphProto) -> int:
    """The plain graph's float type: the type of its logits output."""
    for o in graph.output:
        if o.name == "logits":
            return int(o.type.tensor_type.elem_type)
    return TensorProto.FLOAT
