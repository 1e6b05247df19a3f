"""The graph dtypes, tabled once: what each is called by the manifest, numpy, ONNX, ONNX Runtime and torch.

    name   element    onnx (TensorProto)   ort                 torch        host (CPU KV cache)   storage
    fp32   float32    FLOAT     1          tensor(float)       float32      float32               float32
    fp16   float16    FLOAT16  10          tensor(float16)     float16      float16               float16
    bf16   bfloat16   BFLOAT16 16          tensor(bfloat16)    bfloat16     none                  uint16

`name` is spec-export's --dtype and a model's `dtype` in the manifest; `element` its tensors' element type there (numpy's
names). `torch` is the name of the torch dtype, resolved by the caller (`getattr(torch, d.torch)`): the runtime never
imports torch, and onnx's TensorProto numbers are fixed by the ONNX standard (tests check both against the libraries).
`host` is the numpy type the CPU runtime keeps a KV cache in (numpy has no bfloat16); `storage` a numpy type of the same
size, for buffers that are only allocated and moved (device buffers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from specpack.errors import SpecpackError

DtypeName = Literal["fp32", "fp16", "bf16"]  # the manifest's `dtype` (its JSON schema's enum)
DTYPES: tuple[str, ...] = get_args(DtypeName)  # the graph dtypes spec-export writes (fp16 / bf16 for GPUs)


@dataclass(frozen=True)
class GraphDtype:
    name: str                   # "fp32" | "fp16" | "bf16"
    element: str                # the element type's name (manifest TensorSpec.dtype, numpy): "float32", ...
    onnx: int                   # onnx.TensorProto element type
    ort: str                    # ONNX Runtime's type string (session.get_inputs()[i].type)
    torch: str                  # the torch dtype's attribute name: getattr(torch, torch)
    host: type[np.generic] | None  # the CPU runtime's KV cache dtype; None: no numpy type (bf16)
    storage: type[np.generic]   # a numpy type of the same size


GRAPH_DTYPES: dict[str, GraphDtype] = {d.name: d for d in (
    GraphDtype("fp32", "float32", 1, "tensor(float)", "float32", np.float32, np.float32),
    GraphDtype("fp16", "float16", 10, "tensor(float16)", "float16", np.float16, np.float16),
    GraphDtype("bf16", "bfloat16", 16, "tensor(bfloat16)", "bfloat16", None, np.uint16),
)}
BY_ONNX = {d.onnx: d for d in GRAPH_DTYPES.values()}  # an ONNX element type -> its graph dtype


def graph_dtype(name: str) -> GraphDtype:
    """The table's row of a graph dtype; a SpecpackError for any other name."""
    if name not in GRAPH_DTYPES:
        raise SpecpackError("unsupported graph dtype", expected=" | ".join(DTYPES), found=repr(name),
                            hint="this runtime is older than the pack: upgrade specpack")
    return GRAPH_DTYPES[name]


def numpy_dtype(name: str) -> np.dtype:
    """The host dtype of a graph dtype's KV cache (the heads' q and outputs are fp32 / int64 in every dtype)."""
    host = GRAPH_DTYPES[name].host if name in GRAPH_DTYPES else None
    if host is None:
        hosts = [d.name for d in GRAPH_DTYPES.values() if d.host is not None]
        raise SpecpackError("unsupported graph dtype", expected=" | ".join(hosts), found=repr(name),
                            hint="this runtime is older than the pack: upgrade specpack")
    return np.dtype(host)
