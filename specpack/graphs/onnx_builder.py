"""A tiny node builder on top of onnx.helper: unique value names, constants and `If` branches.

Every value a builder makes is named `<prefix><op>_<n>` from one counter shared with its branch builders,
so nodes can be appended to an exported graph without clashing with its names.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

# A value reference: its name. Builders pass names around, never protos.
Value = str

# Slice "to the end" (ONNX clamps ends to the dimension).
INT64_MAX = np.iinfo(np.int64).max


class GraphBuilder:
    """Collects the nodes of one graph (or one `If` branch) in topological order."""

    def __init__(self, opset: int, prefix: str = "specpack/", _counter: itertools.count[int] | None = None):
        self.opset = opset
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self._counter = _counter if _counter is not None else itertools.count()

    def fresh(self, hint: str) -> Value:
        """A new unique value name."""
        return f"{self.prefix}{hint}_{next(self._counter)}"

    def op(self, op_type: str, *inputs: Value, outputs: int = 1, **attrs: Any) -> Any:
        """Add one node; returns its output name, or a list of names when `outputs` > 1."""
        names = [self.fresh(op_type.lower()) for _ in range(outputs)]
        node = helper.make_node(op_type, list(inputs), names, name=self.fresh(op_type), **attrs)
        self.nodes.append(node)
        return names[0] if outputs == 1 else names

    def const(self, value: npt.ArrayLike, dtype: npt.DTypeLike = np.int64) -> Value:
        """A Constant node holding `value` (a scalar stays 0-d; a list becomes 1-d)."""
        array = np.asarray(value, dtype=dtype)
        return self.op("Constant", value=numpy_helper.from_array(array))

    def if_(self, cond: Value, then_fn: Callable[[GraphBuilder], Sequence[Value]],
            else_fn: Callable[[GraphBuilder], Sequence[Value]], out_types: Sequence[int],
            out_names: Sequence[str] | None = None) -> list[Value]:
        """An `If` node whose branches are built by `then_fn` / `else_fn` on fresh branch builders.

        Each branch returns its output values; an outer-scope value passes through an Identity (a copy),
        as a branch output must be produced inside the branch. `out_types` are their dtypes; `out_names`
        names the If's outputs (graph outputs' contract names), fresh names otherwise.
        """
        branches = []
        for label, fn in (("then", then_fn), ("else", else_fn)):
            sub = GraphBuilder(self.opset, self.prefix, self._counter)
            values = fn(sub)
            made = {o for node in sub.nodes for o in node.output}
            results = [v if v in made else sub.op("Identity", v) for v in values]
            if len(results) != len(out_types):
                raise ValueError(f"{label} branch gave {len(results)} outputs, expected {len(out_types)}")
            outs = [helper.make_tensor_value_info(r, t, None) for r, t in zip(results, out_types, strict=True)]
            branches.append(helper.make_graph(sub.nodes, self.fresh(label), [], outs))
        names = list(out_names) if out_names is not None else [self.fresh("if") for _ in out_types]
        node = helper.make_node("If", [cond], names, name=self.fresh("If"),
                                then_branch=branches[0], else_branch=branches[1])
        self.nodes.append(node)
        return names

    def scan(self, inputs: Sequence[Value], body_fn: Callable[[GraphBuilder, list[Value]], Sequence[Value]],
             in_types: Sequence[int], out_types: Sequence[int]) -> list[Value]:
        """A `Scan` node over axis 0 of each of `inputs` (no state): `body_fn` gets one slice of each (named inputs
        of the body, their first axis dropped) on a fresh body builder and returns the per-iteration outputs, stacked
        along a new axis 0. `in_types` are the inputs' dtypes, `out_types` the outputs'."""
        sub = GraphBuilder(self.opset, self.prefix, self._counter)
        body_inputs = [sub.fresh("row") for _ in inputs]
        values = body_fn(sub, body_inputs)
        made = {o for node in sub.nodes for o in node.output}
        results = [v if v in made else sub.op("Identity", v) for v in values]
        if len(results) != len(out_types):
            raise ValueError(f"scan body gave {len(results)} outputs, expected {len(out_types)}")
        ins = [helper.make_tensor_value_info(n, t, None) for n, t in zip(body_inputs, in_types, strict=True)]
        outs = [helper.make_tensor_value_info(r, t, None) for r, t in zip(results, out_types, strict=True)]
        body = helper.make_graph(sub.nodes, self.fresh("body"), ins, outs)
        names = [self.fresh("scan") for _ in out_types]
        self.nodes.append(helper.make_node("Scan", list(inputs), names, name=self.fresh("Scan"), body=body,
                                           num_scan_inputs=len(inputs)))
        return names

    # Small conveniences used by every head: slicing one axis and reducing with axes as an input.

    def slice(self, x: Value, start: Value | int, end: Value | int, axis: int) -> Value:
        """x[start:end] along `axis`; start / end are ints or int64 [1] values."""
        s = self.const([start]) if isinstance(start, int) else start
        e = self.const([end]) if isinstance(end, int) else end
        return self.op("Slice", x, s, e, self.const([axis]))

    def reduce(self, op_type: str, x: Value, axis: int, keepdims: bool = True) -> Value:
        """ReduceSum / ReduceMax / ReduceMin over one axis (axes as an input: opset 18+). Without keepdims the axis is
        kept, then squeezed: ONNX Runtime's CUDA EP refuses a reduction without keepdims over an empty axis (a tree
        step of T = 0 nodes), which its CPU EP takes."""
        kept = self.op(op_type, x, self.const([axis]), keepdims=1)
        return kept if keepdims else self.op("Squeeze", kept, self.const([axis]))

    def shape_value(self, shape: Value) -> Value:
        """int64 [1] holding the shape value `shape` (int64 [1], a Shape's output), made by a Range over it: the value
        is computed on the device. A shape value used as data directly is a host tensor, and ONNX Runtime's CUDA EP
        then copies it in (a Memcpy node), which refuses CUDA-graph capture ("not all nodes partitioned")."""
        value = self.op("Squeeze", shape, self.const([0]))
        return self.op("Range", value, self.op("Add", value, self.const(1)), self.const(1))


def tensor_info(name: str, elem_type: int, shape: Sequence[int | str] | None) -> onnx.ValueInfoProto:
    """`helper.make_tensor_value_info`, re-exported so callers import one module."""
    return helper.make_tensor_value_info(name, elem_type, shape)


FLOAT, INT64, DOUBLE, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.DOUBLE, TensorProto.BOOL
