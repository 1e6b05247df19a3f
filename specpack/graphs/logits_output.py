"""A pack graph with its internal `logits` made a graph output, for the reference backend (a test oracle).

draft_step.onnx and verify.onnx keep the plain forward's logits as an internal value (attach.py): the
rows the head reads, [1, rows, V_model] (or every position, [1, S, V_model], where the lm_head was not
pruned). Exposing it lets the numpy oracle sample and accept from the very logits the head sees.
Loads the weights into memory: meant for small packs (a serialized model is limited to 2 GB).
"""

from __future__ import annotations

from pathlib import Path

import onnx

from specpack import names
from specpack.errors import SpecpackError

LOGITS_ELEM_TYPES = {"fp32": onnx.TensorProto.FLOAT, "fp16": onnx.TensorProto.FLOAT16,
                     "bf16": onnx.TensorProto.BFLOAT16}


def with_logits_output(graph_path: Path, dtype: str) -> bytes:
    """The serialized graph at `graph_path` (external data loaded) with `logits` as an extra output."""
    model = onnx.load(str(graph_path))
    if names.LOGITS not in {o for node in model.graph.node for o in node.output}:
        raise SpecpackError(f"{graph_path.name} has no internal {names.LOGITS!r} value",
                            expected="a graph written by spec-export", found="no such value")
    model.graph.output.append(onnx.helper.make_tensor_value_info(names.LOGITS, LOGITS_ELEM_TYPES[dtype], None))
    try:
        return model.SerializeToString()
    except ValueError as err:  # protobuf refuses messages over 2 GB
        raise SpecpackError("the reference backend runs small packs only", expected="a graph under 2 GB",
                            found=f"{graph_path.name}: {err}", hint="use --device cpu") from err
