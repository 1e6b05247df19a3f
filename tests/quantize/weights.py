"""Read a quantized graph's weights back: what each MatMulNBits / GatherBlockQuantized site dequantizes to.

Initializer names follow quantize/rewrite.py: `{tensor}.nbits{bits}` (B), `{tensor}.scales`, `{tensor}.zero_points`,
`{tensor}.mins` ([K/bs, N], the MatMul form) or `{tensor}.row_mins` ([V, H/bs], the Gather form); a tied table's
gather reads `{tensor}.nbits{bits}` too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from specpack.quantize.nbits import BlockQuant


def initializers(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))  # small test graphs: weights loaded
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def dequantized(record: dict[str, Any], inits: dict[str, np.ndarray]) -> np.ndarray:
    """W [K, N] of one quantized tensor (a manifest record's entry), min term included."""
    t, bits, block = record["tensor"], record["bits"], record["block_size"]
    k, n = record["k"], record["n"]
    packed = inits[f"{t}.nbits{bits}"].reshape(n, k // block, block * bits // 8)
    mins = inits[f"{t}.mins"].T if f"{t}.mins" in inits else inits.get(f"{t}.row_mins")
    return BlockQuant(bits, block, packed, inits[f"{t}.scales"], inits.get(f"{t}.zero_points"), mins).dequantize()


def with_weights(plain: Path, out: Path, weights: dict[str, np.ndarray]) -> Path:
    """A copy of the plain graph `plain` whose initializers named in `weights` hold those values (W or E layout)."""
    model = onnx.load(str(plain))
    for i, t in enumerate(model.graph.initializer):
        if t.name in weights:
            values = weights[t.name]
            shaped = values if list(values.shape) == list(t.dims) else values.T
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(shaped, np.float32), t.name))
    onnx.save_model(model, str(out))
    return out


def with_accuracy_level(path: Path, out: Path, level: int) -> Path:
    """A copy of a quantized graph whose MatMulNBits nodes run at accuracy `level` (0: fp32, exact arithmetic)."""
    model = onnx.load(str(path))
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for a in node.attribute:
                if a.name == "accuracy_level":
                    a.i = level
    onnx.save_model(model, str(out))
    return out
