"""The plain sampling form of a pack graph: sampling at a temperature, without top-k or top-p, with no control flow.

ONNX Runtime captures CUDA graphs only of graphs without control flow (greedy_form.py). A sampling request whose
top-k and top-p filter nothing (top_k 0 or >= V, top_p 1: what an OpenAI client sends unless asked) reads only the
sampling branch of the head's If and, inside it, the transform's unfiltered branch (sampling_graph.transform), so for
it this form computes what the graph as exported computes, node for node:

    If(temperature == 0, then=greedy, else=sampling) -> outs
      becomes   the sampling branch's nodes, Identity(its outputs) -> outs
    inside it   If(top_k on or top_p on, then=filtered, else=unfiltered) -> probs
      becomes   the unfiltered branch's nodes, Identity(its output) -> probs

The filter's If is found by its structure (its filtered branch sorts: a TopK; the unfiltered one does not), so packs
exported before this form existed have one too. A graph whose head keeps other control flow (the tensorrt form's
transform, a tree head) has none: ValueError, and its sampling requests run on the graph as exported.
`SamplingParams.filters(vocab)` false (and not greedy): the requests it serves.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import helper

from specpack.graphs.greedy_form import HEAD_OUTPUTS

CONTROL_FLOW = ("If", "Loop", "Scan")


def plain_sampling_form(path: Path, data: bytes | None = None) -> bytes:
    """The graph at `path` (weights not loaded; or its bytes, `data`) with its head's If inlined as the sampling
    branch and the transform's filter If as its unfiltered branch, serialized. ValueError when the graph has no head
    If, no filter If in its sampling branch, or other control flow."""
    model = onnx.load_from_string(data) if data is not None else onnx.load(str(path), load_external_data=False)
    graph = model.graph
    nodes: list[onnx.NodeProto] = []
    heads = filters = 0
    for node in graph.node:
        if node.op_type == "If" and set(node.output) in HEAD_OUTPUTS:
            sampling = _branch(node, "else_branch")  # heads.py: then greedy, else sampling
            heads += 1
            for inner in sampling.node:
                if inner.op_type == "If" and _is_filter(inner):
                    nodes.extend(_inline(inner, "else_branch", graph))  # sampling_graph.transform: else unfiltered
                    filters += 1
                else:
                    nodes.append(inner)
            graph.initializer.extend(sampling.initializer)
            nodes.extend(helper.make_node("Identity", [out.name], [name], name=f"plain_{name}")
                         for out, name in zip(sampling.output, node.output, strict=True))
        else:
            nodes.append(node)
    control = [n.name or n.op_type for n in nodes if n.op_type in CONTROL_FLOW]
    if heads != 1 or filters < 1 or control:
        raise ValueError(f"{path.name}: expected one head If with a filter If in its sampling branch and no other "
                         f"control flow, found {heads} head If, {filters} filter If and {control}")
    del graph.node[:]
    graph.node.extend(nodes)
    return model.SerializeToString()


def _branch(node: onnx.NodeProto, name: str) -> onnx.GraphProto:
    return next(a.g for a in node.attribute if a.name == name)


def _sorts(graph: onnx.GraphProto) -> bool:
    """Whether a TopK runs anywhere in `graph`, its subgraphs included."""
    for node in graph.node:
        if node.op_type == "TopK":
            return True
        if any(_sorts(a.g) for a in node.attribute if a.type == onnx.AttributeProto.GRAPH):
            return True
    return False


def _is_filter(node: onnx.NodeProto) -> bool:
    """sampling_graph.transform's If: one output, a filtered branch that sorts (top-k, top-p) and one that does not."""
    return len(node.output) == 1 and _sorts(_branch(node, "then_branch")) and not _sorts(_branch(node, "else_branch"))


def _inline(node: onnx.NodeProto, name: str, graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The branch's nodes and an Identity from its output to the If's (its initializers moved to `graph`)."""
    branch = _branch(node, name)
    graph.initializer.extend(branch.initializer)
    return [*branch.node, *(helper.make_node("Identity", [out.name], [dest], name=f"plain_{dest}")
                            for out, dest in zip(branch.output, node.output, strict=True))]
