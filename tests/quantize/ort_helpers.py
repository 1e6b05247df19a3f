"""One-node ONNX Runtime graphs over a BlockQuant: MatMulNBits and GatherBlockQuantized, as the CPU EP runs them."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specpack.quantize.nbits import BlockQuant


def _run(node: Any, inputs: list[Any], initializers: list[Any], feed: dict[str, np.ndarray], out_type: int) -> np.ndarray:
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", out_type, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def _quant_inits(bq: BlockQuant, packed: np.ndarray) -> tuple[list[str], list[Any]]:
    names, inits = ["B", "scales"], [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(bq.scales, "scales")]
    if bq.zero_points is not None:
        names.append("zp")
        inits.append(numpy_helper.from_array(bq.zero_points, "zp"))
    return names, inits


def matmul_nbits(x: np.ndarray, bq: BlockQuant, accuracy_level: int = 0) -> np.ndarray:
    """x [M, K] @ W [K, N] by MatMulNBits with bq's bytes (no min term)."""
    names, inits = _quant_inits(bq, bq.packed)
    node = helper.make_node("MatMulNBits", ["x", *names], ["y"], domain="com.microsoft", K=bq.k, N=bq.n, bits=bq.bits,
                            block_size=bq.block_size, accuracy_level=accuracy_level)
    return _run(node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))], inits, {"x": x},
                TensorProto.FLOAT)


def gather_block_quantized(ids: np.ndarray, bq: BlockQuant) -> np.ndarray:
    """Rows `ids` of the table E = W^T [N, K] by GatherBlockQuantized with bq's bytes (no min term)."""
    names, inits = _quant_inits(bq, bq.packed.reshape(bq.n, -1))
    node = helper.make_node("GatherBlockQuantized", [names[0], "ids", *names[1:]], ["y"], domain="com.microsoft",
                            bits=bq.bits, block_size=bq.block_size, gather_axis=0, quantize_axis=1)
    return _run(node, [helper.make_tensor_value_info("ids", TensorProto.INT64, list(ids.shape))], inits, {"ids": ids},
                TensorProto.FLOAT)
