"""The graph ONNX Runtime opened is the graph the manifest describes: same inputs and outputs, types and sizes.

The manifest's I/O spec sizes every buffer the runtime binds; a mismatch (a hand-edited manifest, a graph
from another export) would otherwise surface as a raw ONNX Runtime error in the middle of generation.
"""

from __future__ import annotations

from typing import Any

from specpack import names
from specpack.contract.manifest import GraphEntry, TensorSpec
from specpack.dtypes import GRAPH_DTYPES
from specpack.errors import SpecpackError

SHOWN = 5
# ONNX Runtime's type strings -> the manifest's element types (numpy names)
ORT_TYPES = {**{d.ort: d.element for d in GRAPH_DTYPES.values()},
             "tensor(double)": "float64", "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8",
             "tensor(uint8)": "uint8", "tensor(bool)": "bool"}


def check_graph_matches(spec: GraphEntry, session: Any, label: str) -> None:
    """SpecpackError naming the first differences between the manifest's I/O spec and the session's."""
    problems = []
    for kind, declared, actual in (("input", spec.inputs, session.get_inputs()),
                                   ("output", spec.outputs, session.get_outputs())):
        want = {s.name: s for s in declared}
        have = {a.name: a for a in actual}
        problems += [f"{kind} {name}: in the manifest, not in the graph" for name in sorted(want.keys() - have.keys())]
        problems += [f"{kind} {name}: in the graph, not in the manifest" for name in sorted(have.keys() - want.keys())]
        problems += [p for name in sorted(want.keys() & have.keys()) if (p := _differs(kind, want[name], have[name]))]
    if problems:
        more = f" (and {len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
        raise SpecpackError(f"{label} does not match the manifest's description of it",
                            expected="the inputs and outputs the manifest lists", found="; ".join(problems[:SHOWN]) + more,
                            hint="the manifest was edited or comes from another export: re-export the pack")
    _check_kv_form(spec, session, label)


def _check_kv_form(spec: GraphEntry, session: Any, label: str) -> None:
    """The manifest's `kv_cache` is the graph's. A torch export names its dims (export/torch_export.py): a static
    graph's attention_mask is as long as its past buffers ([1, M] and [1, H, M, D]), a concat graph's mask covers
    past and new tokens (total_sequence_length) while its past is past_sequence_length. onnxruntime-genai's builder
    graphs (always static) name their dims otherwise, and are not checked here."""
    if spec.exporter != "torch":
        return
    inputs = {i.name: i.shape for i in session.get_inputs()}
    past, mask = inputs.get(names.kv_names(1, "past")[0]), inputs.get(names.ATTENTION_MASK)
    if not past or not mask or len(past) != 4 or len(mask) != 2:
        return  # the I/O check above has refused it already
    static = mask[1] == past[2]
    if static != (spec.kv_cache == "static"):
        form = "static" if static else "concat"
        raise SpecpackError(f"{label} is not of the KV cache form the manifest says",
                            expected=f"kv_cache {spec.kv_cache!r}", found=f"a {form}-cache graph (attention_mask "
                            f"length {mask[1]}, past length {past[2]})",
                            hint="the manifest was edited or comes from another export: re-export the pack")


def _differs(kind: str, declared: TensorSpec, actual: Any) -> str | None:
    dtype = ORT_TYPES.get(actual.type)
    if dtype is not None and dtype != declared.dtype:
        return f"{kind} {declared.name}: {declared.dtype} in the manifest, {dtype} in the graph"
    if actual.shape is None:  # no shape information in the graph: nothing to compare
        return None
    shape = list(actual.shape)
    fixed_differ = any(isinstance(a, int) and isinstance(d, int) and a != d
                       for a, d in zip(shape, declared.shape, strict=False))
    if len(shape) != len(declared.shape) or fixed_differ:
        return f"{kind} {declared.name}: shape {declared.shape} in the manifest, {shape} in the graph"
    return None
