"""Where a plain graph keeps its weights: the MatMuls and embedding Gathers a quantizer may replace.

    MatMul(x [.., K], W [K, N])             W an initializer             -> a "matmul" site
    Gather(E [V, H], input_ids), axis 0     E an initializer             -> an "embedding" site (W = E^T)
    MatMul(x, Transpose(E)), E an embedding -> a "tied" site: the lm_head reads the embedding's table

Every site is described as a weight W [K, N] (an embedding table E [V, H] as W = E^T, K = H, N = V), the
layout MatMulNBits quantizes along K. Nothing here reads weight values: graphs are loaded with
load_external_data=False, and `WeightReader` maps an initializer's bytes from its external-data file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from specpack.dtypes import GRAPH_DTYPES

_FLOATS: dict[int, type] = {d.onnx: d.host for d in GRAPH_DTYPES.values() if d.host is not None}  # numpy can hold


@dataclass(frozen=True)
class Site:
    kind: str          # "matmul" | "embedding" | "tied"
    node: int          # index in graph.node of the MatMul / Gather
    tensor: str        # the initializer holding the values: W [K, N] ("matmul"), E [V, H] ("embedding", "tied")
    k: int
    n: int
    transpose: int | None = None  # "tied": index of the Transpose node between E and the MatMul

    def weight_of(self, values: np.ndarray) -> np.ndarray:
        """W [K, N] from the initializer's values."""
        return values if self.kind == "matmul" else values.T


def find_sites(graph: onnx.GraphProto) -> list[Site]:
    """The weight sites of a plain graph's main graph, in node order (subgraphs are left alone)."""
    inits = {t.name: t for t in graph.initializer if t.data_type in _FLOATS and len(t.dims) == 2}
    inits = {name: t for name, t in inits.items() if name not in {i.name for i in graph.input}}
    producers = {o: i for i, node in enumerate(graph.node) for o in node.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    sites: list[Site] = []
    embeddings: set[str] = set()
    for i, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "Gather" and node.input[0] in inits and _attr(node, "axis", 0) == 0:
            v, h = inits[node.input[0]].dims
            sites.append(Site("embedding", i, node.input[0], k=h, n=v))
            embeddings.add(node.input[0])
    for i, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx") or node.op_type != "MatMul" or len(node.input) != 2:
            continue
        weight = node.input[1]
        if weight in inits and readers[weight] == 1 and weight not in embeddings:
            k, n = inits[weight].dims
            sites.append(Site("matmul", i, weight, k=k, n=n))
        elif weight in producers:
            t = graph.node[producers[weight]]
            if (t.op_type == "Transpose" and t.domain in ("", "ai.onnx") and t.input[0] in embeddings
                    and list(_attr(t, "perm", [1, 0])) == [1, 0] and readers[weight] == 1):
                v, h = inits[t.input[0]].dims
                sites.append(Site("tied", i, t.input[0], k=h, n=v, transpose=producers[weight]))
    return sorted(sites, key=lambda s: s.node)


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


class WeightReader:
    """An initializer's values as a numpy array (external data memory-mapped, inline data decoded).

    Each read maps only that tensor's bytes, and the map goes with the array: the pages a process has read from a
    mapped file stay in its resident memory while the map lives, so one map of the whole data file, kept open,
    would grow to the file's size (6.8 GB for the 1.5B target) as every weight is read."""

    def __init__(self, model_path: Path) -> None:
        self.base = Path(model_path).parent

    def read(self, tensor: TensorProto) -> np.ndarray:
        dtype = _FLOATS.get(tensor.data_type)
        if tensor.data_location != TensorProto.EXTERNAL:
            return numpy_helper.to_array(tensor)
        np_dtype = np.dtype(dtype) if dtype is not None else onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
        count = int(np.prod(tensor.dims)) if tensor.dims else 1
        return self._map(tensor, count * np_dtype.itemsize).view(np_dtype).reshape(tuple(tensor.dims))

    def raw_bytes(self, tensor: TensorProto) -> bytes | memoryview:
        """The tensor's stored bytes (for copying a tensor unchanged into a new data file)."""
        if tensor.data_location != TensorProto.EXTERNAL:
            return tensor.raw_data
        info = {e.key: e.value for e in tensor.external_data}
        return memoryview(self._map(tensor, int(info["length"])).data)

    def _map(self, tensor: TensorProto, length: int) -> np.ndarray:
        """uint8 [length]: the tensor's bytes in its external data file, mapped (an empty array for no bytes)."""
        info = {e.key: e.value for e in tensor.external_data}
        if length == 0:
            return np.empty(0, np.uint8)
        return np.memmap(self.base / info["location"], dtype=np.uint8, mode="r", offset=int(info.get("offset", 0)),
                         shape=(length,))
