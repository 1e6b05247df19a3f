"""Compute logits only at the positions a head reads: slice the hidden states right before the lm_head.

A plain graph computes logits [B, S, V] for every position; the draft head reads the last one, the verify
head the last k + 1. The lm_head MatMul costs 2 * S * H * V flops (Qwen2.5-1.5B: 467 MFLOP a position, so
~120 GFLOP for a 256-token prefill, all but one row thrown away). `find_lm_head` finds the MatMul that makes
`logits`; `slice_lm_head_input` feeds it the last rows of its hidden-state input instead:

    hidden [B,S,H] ─────────────────────> MatMul(·, W [H,V]) ─(Cast / bias / scale ...)─> logits [B,S,V]
    hidden [B,S,H] ─Slice(axis 1, -rows:)─> MatMul(·, W [H,V]) ─(Cast / bias / scale ...)─> logits [B,rows,V]

The slice sits right before the MatMul, after the final norm (which works per position), so whatever
shape arithmetic feeds the hidden states (GPT-2's Reshape to [B, S, H] reads S) is untouched, and so are
the presents: only the MatMul's input changes. Recognized forms (torch.onnx dynamo exports of Llama, Qwen2,
Mistral, GPT-2, tied or not, and their quantized forms from specpack/quantize/): `logits = MatMul(hidden, W)`
with W a constant 2-D weight (an initializer, or computed from initializers only, e.g. Transpose of a tied
embedding), or ONNX Runtime's `MatMulNBits(hidden, B, scales, ...)` with constant block-quantized weights
(K x N from its attributes), then any number of per-position ops: Cast / Identity / Tanh, or
Add / Sub / Mul / Div with a constant that is the same at every position.
Anything else gets a reason string instead, and attach.py slices the logits (correct, just slower).
Nothing here reads weights: graphs are loaded with load_external_data=False.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from specpack import names

UNARY = frozenset({"Cast", "Identity", "Tanh"})  # element-wise: logits-side ops that act per position
BINARY = frozenset({"Add", "Sub", "Mul", "Div"})  # element-wise with a constant (bias, scale, soft-cap)
_NOT_CONSTANT = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                           "Bernoulli"})
_DEFAULT_DOMAINS = ("", "ai.onnx")
_MS_DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class LmHead:
    """The lm_head MatMul of a plain graph and the values from its output to `logits`."""

    node: str  # the MatMul's node name (unique in the graph) or, if unnamed, its output name
    index: int  # its position in graph.node
    hidden: str  # its hidden-state input [B, S, H]
    path: tuple[str, ...]  # values from the MatMul's output up to `logits`, both included


def find_lm_head(graph: onnx.GraphProto) -> LmHead | str:
    """The MatMul that computes `logits`, or why it was not found (a reason for a warning)."""
    producers = {o: i for i, node in enumerate(graph.node) for o in node.output if o}
    consumers: dict[str, int] = {}
    for node in graph.node:
        for i in node.input:
            consumers[i] = consumers.get(i, 0) + 1
    constants = _constant_values(graph)
    shapes = _shapes(graph)
    outputs = {o.name for o in graph.output}
    value, path = names.LOGITS, [names.LOGITS]
    if consumers.get(value, 0):
        return f"{value!r} is also read inside the graph"
    while True:
        if value not in producers:
            return f"{value!r} is not made by a node of the main graph"
        node = graph.node[producers[value]]
        where = f"{node.op_type} node {node.name or '(unnamed)'!r} makes {value!r}"
        if _is_matmul_nbits(node):
            break
        if node.domain not in _DEFAULT_DOMAINS:
            return f"{where}; expected an ONNX op, or ONNX Runtime's MatMulNBits"
        if node.op_type == "MatMul":
            break
        if node.op_type in UNARY:
            value = node.input[0]
        elif node.op_type in BINARY:
            dynamic = [i for i in node.input if i not in constants]
            constant = [i for i in node.input if i in constants]
            if len(dynamic) != 1 or len(constant) != 1 or not _same_at_every_position(shapes.get(constant[0])):
                return (f"{where}; expected {node.op_type} of the lm_head's output with a constant that is the "
                        f"same at every position (rank <= 1, or size 1 on the position axis)")
            value = dynamic[0]
        else:
            return (f"{where}; expected the lm_head MatMul(hidden [B, S, H], W [H, V]), optionally followed by "
                    f"{' / '.join(sorted(UNARY))}, or {' / '.join(sorted(BINARY))} with a constant")
        if consumers.get(value, 0) != 1 or value in outputs:
            return f"{value!r}, on the way from the lm_head to {names.LOGITS!r}, is also used elsewhere"
        path.append(value)
    hidden, weight, *quant = node.input
    if weight not in constants or hidden in constants or any(q and q not in constants for q in quant):
        return f"{where}; expected MatMul(hidden states, constant weight), found inputs {list(node.input)}"
    weight_shape, hidden_shape = shapes.get(weight), shapes.get(hidden)
    if _is_matmul_nbits(node):  # B is packed [N, K/bs, blob]: the logical weight is [K, N]
        attrs = {a.name: a.i for a in node.attribute}
        weight_shape = [attrs["K"], attrs["N"]] if "K" in attrs and "N" in attrs else None
    if weight_shape is None or len(weight_shape) != 2:
        return f"{where}: its weight {weight!r} has shape {weight_shape}; expected a known 2-D [H, V]"
    if hidden_shape is not None and len(hidden_shape) != 3:
        return f"{where}: its hidden-state input {hidden!r} has rank {len(hidden_shape)}; expected [B, S, H]"
    return LmHead(node=node.name or node.output[0], index=producers[value], hidden=hidden, path=tuple(reversed(path)))


def slice_lm_head_input(graph: onnx.GraphProto, lm_head: LmHead, nodes: list[onnx.NodeProto], sliced: str) -> None:
    """Insert `nodes` (they make `sliced`, the last rows of lm_head.hidden) right before the MatMul, and feed
    it `sliced`. The values downstream of it lose their declared shapes (their position axis is now `rows`)."""
    matmul = graph.node[lm_head.index]
    if matmul.input[0] != lm_head.hidden:  # find_lm_head's result belongs to this graph, unedited
        raise ValueError(f"graph changed since find_lm_head: {lm_head.node!r} no longer reads {lm_head.hidden!r}")
    matmul.input[0] = sliced
    if nodes:
        after = list(graph.node[lm_head.index :])
        del graph.node[lm_head.index :]
        graph.node.extend([*nodes, *after])
    stale = set(lm_head.path)
    kept = [v for v in graph.value_info if v.name not in stale]
    if len(kept) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(kept)


def _is_matmul_nbits(node: onnx.NodeProto) -> bool:
    return node.op_type == "MatMulNBits" and node.domain == _MS_DOMAIN


def _constant_values(graph: onnx.GraphProto) -> set[str]:
    """Values that are the same on every run: initializers (not overridable by an input), Constant outputs,
    and outputs of deterministic nodes whose inputs all are constant. graph.node is in topological order."""
    inputs = {i.name for i in graph.input}
    found = {t.name for t in graph.initializer if t.name not in inputs}
    found |= {t.values.name for t in graph.sparse_initializer if t.values.name not in inputs}
    for node in graph.node:
        if node.op_type in _NOT_CONSTANT or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                                for a in node.attribute):
            continue
        if node.op_type == "Constant" or (node.input and all(i in found for i in node.input if i)):
            found.update(o for o in node.output if o)
    return found


Shape = list[int | str | None]  # a dim's value, its symbol, or None when unknown


def _shapes(graph: onnx.GraphProto) -> dict[str, Shape]:
    """Every value whose rank is declared: value_info, inputs, outputs, initializers, Constant tensors."""
    found: dict[str, Shape] = {}
    for info in [*graph.value_info, *graph.input, *graph.output]:
        tensor_type = info.type.tensor_type
        if info.type.HasField("tensor_type") and tensor_type.HasField("shape"):
            found[info.name] = [d.dim_value if d.HasField("dim_value") else d.dim_param or None
                                for d in tensor_type.shape.dim]
    for tensor in graph.initializer:
        found[tensor.name] = list(tensor.dims)
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS:
            for attr in node.attribute:
                if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                    found[node.output[0]] = list(attr.t.dims)
                elif attr.name in ("value_float", "value_int"):
                    found[node.output[0]] = []
                elif attr.name in ("value_floats", "value_ints"):
                    found[node.output[0]] = [len(attr.floats) or len(attr.ints)]
    return found


def _same_at_every_position(shape: Shape | None) -> bool:
    """A constant operand of logits [B, S, V] that broadcasts the same value to every position: rank <= 1,
    or rank 2 / 3 with size 1 on the axis that lines up with S (right-aligned broadcasting)."""
    if shape is None or len(shape) > 3:
        return False
    return len(shape) <= 1 or shape[-2] == 1
