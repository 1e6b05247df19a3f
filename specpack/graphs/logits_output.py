"""A pack graph with its internal `logits` made a graph output, for the reference backend (a test oracle).

draft_step.onnx and verify.onnx keep the plain forward's logits as an internal value (attach.py): the
rows the head reads, [1, rows, V_model] (or every position, [1, S, V_model], where the lm_head was not
pruned). Exposing it lets the numpy oracle sample and accept from the very logits the head sees.
Loads the weights into memory: meant for small packs (a serialized model is limited to 2 GB).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from specpack import names
from specpack.dtypes import GRAPH_DTYPES
from specpack.errors import SpecpackError

if TYPE_CHECKING:
    from specpack.contract.verified_read import GraphBytes

def with_logits_output(graph_path: Path, dtype: str, verified: GraphBytes | None = None) -> bytes:
    """The serialized graph at `graph_path` (external data loaded) with `logits` as an extra output; `verified`:
    the graph's and its external data's bytes, already read and hashed (a pinned load: nothing is read from disk)."""
    model = onnx.load(str(graph_path)) if verified is None else _from_verified(verified)
    if names.LOGITS not in {o for node in model.graph.node for o in node.output}:
        raise SpecpackError(f"{graph_path.name} has no internal {names.LOGITS!r} value",
                            expected="a graph written by spec-export", found="no such value")
    model.graph.output.append(onnx.helper.make_tensor_value_info(names.LOGITS, GRAPH_DTYPES[dtype].onnx, None))
    try:
        return model.SerializeToString()
    except ValueError as err:  # protobuf refuses messages over 2 GB
        raise SpecpackError("the reference backend runs small packs only", expected="a graph under 2 GB",
                            found=f"{graph_path.name}: {err}", hint="use --device cpu") from err


def _from_verified(verified: GraphBytes) -> onnx.ModelProto:
    """The model from verified bytes, its external tensors filled in from the verified data files."""
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    model = onnx.load_from_string(verified.model)
    for tensor in _get_all_tensors(model):
        if uses_external_data(tensor):
            info = ExternalDataInfo(tensor)
            if info.location not in verified.external:
                raise SpecpackError(f"{verified.name} names external data the manifest does not list",
                                    expected=f"one of {sorted(verified.external)}", found=repr(info.location)[:80],
                                    hint="re-export the pack")
            data, start = verified.external[info.location], int(info.offset or 0)
            tensor.raw_data = data[start: start + int(info.length) if info.length else len(data)]
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
    return model
