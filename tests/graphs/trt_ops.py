"""Check an ONNX graph against TensorRT's ONNX parser support, as data/onnx_tensorrt_operators.json records it.

    problems(model) -> ["<node> (<op>): <what>", ...]   empty: every node passes

Every node, subgraphs (If branches, Loop bodies) included: default ONNX domain only (no ONNX Runtime contrib
ops), an operator the table marks supported, element types of its checked tensors in the op's list, no DOUBLE
anywhere, the default opset within the table's range, and each per-op restriction that can apply. A
restriction the table states but this module has no check for ("unchecked") fails, so a new operator in the
graphs gets a check written before it passes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

TABLE = Path(__file__).parent / "data" / "onnx_tensorrt_operators.json"
TYPE_NAMES = {TensorProto.FLOAT: "FP32", TensorProto.FLOAT16: "FP16", TensorProto.BFLOAT16: "BF16",
              TensorProto.INT32: "INT32", TensorProto.INT64: "INT64", TensorProto.INT8: "INT8",
              TensorProto.UINT8: "UINT8", TensorProto.BOOL: "BOOL", TensorProto.FLOAT8E4M3FN: "FP8",
              TensorProto.INT4: "INT4", TensorProto.DOUBLE: "DOUBLE"}


@cache
def table() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(TABLE.read_text())
    types: dict[str, list[str]] = {}
    for group, ops in data["ops"].items():
        for op in ops:
            types.setdefault(op, []).extend(data["type_groups"][group])
    types.update(data["extra_types"])
    data["types"] = types
    return data


def walk_nodes(graph: onnx.GraphProto) -> Iterator[tuple[onnx.NodeProto, onnx.GraphProto]]:
    """Every node with the graph that holds it, subgraphs first-class."""
    for node in graph.node:
        yield node, graph
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else attr.graphs:
                yield from walk_nodes(sub)


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else attr.graphs:
                yield from _graphs(sub)


class _Facts:
    """Element types and constant values of every value name (names are unique across scopes in these graphs)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        inferred = onnx.shape_inference.infer_shapes(model)
        self.types: dict[str, int] = {}
        self.ranks: dict[str, int] = {}
        self.constants: dict[str, np.ndarray | None] = {}  # None: constant, value not loaded (external data)
        for graph in _graphs(inferred.graph):
            for info in [*graph.input, *graph.value_info, *graph.output]:
                tensor = info.type.tensor_type
                if tensor.elem_type:
                    self.types[info.name] = tensor.elem_type
                if tensor.HasField("shape"):
                    self.ranks[info.name] = len(tensor.shape.dim)
            for init in graph.initializer:
                self.types[init.name] = init.data_type
                self.constants[init.name] = None if init.data_location == TensorProto.EXTERNAL else \
                    numpy_helper.to_array(init)
            for node in graph.node:
                if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                    value = next((a.t for a in node.attribute if a.name == "value"), None)
                    if value is not None:
                        self.types[node.output[0]] = value.data_type
                        self.constants[node.output[0]] = numpy_helper.to_array(value)
        self.model = inferred
        self._propagate_ranks()

    def _propagate_ranks(self) -> None:
        """Ranks shape inference leaves unknown: Identity (a branch's pass-through) and If outputs, to a fixpoint."""
        nodes = [n for n, _ in walk_nodes(self.model.graph) if n.op_type in ("Identity", "If")]
        changed = True
        while changed:
            changed = False
            for node in nodes:
                if node.op_type == "Identity":
                    pairs = [(node.output[0], [node.input[0]])]
                else:
                    then, other = (next(a.g for a in node.attribute if a.name == n) for n in ("then_branch", "else_branch"))
                    pairs = [(o, [a.name, b.name]) for o, a, b in zip(node.output, then.output, other.output, strict=True)]
                    pairs += [(a.name, [o]) for o, a in zip(node.output, then.output, strict=True)]
                    pairs += [(b.name, [o]) for o, b in zip(node.output, other.output, strict=True)]
                for out, sources in pairs:
                    known = [self.ranks[x] for x in sources if x in self.ranks]
                    if out not in self.ranks and known:
                        self.ranks[out] = known[0]
                        changed = True


def problems(model: onnx.ModelProto) -> list[str]:
    """Everything in `model` that TensorRT's ONNX parser does not support, per the table; [] when nothing."""
    data, facts = table(), _Facts(model)
    found = []
    low, high = data["opset"]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if not low <= opset <= high:
        found.append(f"model: default opset {opset} outside TensorRT's range {low}..{high}")
    found += [f"value {name}: DOUBLE" for name, t in facts.types.items() if t == TensorProto.DOUBLE]
    for node, _ in walk_nodes(facts.model.graph):
        where = f"{node.name or node.output[0]} ({node.op_type})"
        if node.domain not in ("", "ai.onnx"):
            found.append(f"{where}: domain {node.domain!r} (not a default ONNX op)")
            continue
        allowed = data["types"].get(node.op_type)
        if allowed is None:
            found.append(f"{where}: not supported by TensorRT's ONNX parser")
            continue
        for name in _checked(node, data):
            t = facts.types.get(name)
            label = TYPE_NAMES.get(t, f"type {t}") if t is not None else "unknown type"
            if label not in allowed:
                found.append(f"{where}: {name} is {label}, supported {allowed}")
        for rule in data["restrictions"].get(node.op_type, []):
            if (error := _restriction(node, rule, facts)) is not None:
                found.append(f"{where}: {rule['text']}: {error}")
    return found


def _checked(node: onnx.NodeProto, data: dict[str, Any]) -> list[str]:
    """The tensors whose element type the table's column constrains for this node."""
    spec = data["checked_tensors"].get(node.op_type) or (
        data["checked_tensors"]["binary"] if node.op_type in data["binary_ops"] else data["checked_tensors"]["default"])
    out = []
    for item in spec:
        if item == "ins":
            out += [i for i in node.input if i]
        elif item == "outs":
            out += [o for o in node.output if o]
        else:
            values, index = (node.input, int(item[2:])) if item.startswith("in") else (node.output, int(item[3:]))
            if index < len(values) and values[index]:
                out.append(values[index])
    return out


def _restriction(node: onnx.NodeProto, rule: dict[str, Any], facts: _Facts) -> str | None:
    """None when `node` meets `rule`, else what breaks it."""
    check = rule["check"]
    index = rule.get("input", 0)
    name = node.input[index] if index < len(node.input) else ""
    if check == "constant_input":
        return None if not name or name in facts.constants else f"input {index} ({name}) is computed at run time"
    if check == "constant_below":
        value = facts.constants.get(name)
        if value is None:
            return f"input {index} is not a known constant"
        return None if int(np.max(value)) < rule["limit"] else f"K = {int(np.max(value))}"
    if check == "zero_point_zero":
        if not name:
            return None
        value = facts.constants.get(name)
        return None if value is not None and not np.any(value.astype(np.float32)) else "zero point not a constant 0"
    if check == "attribute_equals":
        attr = next((a for a in node.attribute if a.name == rule["attribute"]), None)
        got = rule["default"] if attr is None else onnx.helper.get_attribute_value(attr)
        got = got.decode() if isinstance(got, bytes) else got
        return None if got == rule["value"] else f"{rule['attribute']} = {got!r}"
    if check == "if_branches":
        then, other = (next(a.g for a in node.attribute if a.name == n) for n in ("then_branch", "else_branch"))
        names = [(a.name, b.name) for a, b in zip(then.output, other.output, strict=True)]
        same = [a for a, b in names if a == b]
        ranks = [(facts.ranks.get(a), facts.ranks.get(b)) for a, b in names]
        unequal = [r for r in ranks if r[0] != r[1] or None in r]  # an unknown rank is not a proof
        return None if not same and not unequal else f"shared names {same}, ranks (then, else) {unequal}"
    if check == "no_scan_outputs":
        body = next(a.g for a in node.attribute if a.name == "body")
        carried = len(body.input) - 2
        return None if len(body.output) - 1 == carried else f"{len(body.output) - 1 - carried} scan outputs"
    if check == "dense_constant":
        bad = [a.name for a in node.attribute if a.name in ("sparse_value", "value_string", "value_strings")]
        return None if not bad else f"attributes {bad}"
    if check == "single_output":
        return None if len([o for o in node.output if o]) == 1 else "more than one output"
    return f"no check written for this restriction ({check})"
