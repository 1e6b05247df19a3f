"""The greedy form of a pack graph: each head's greedy/sampling `If` replaced by its greedy branch.

ONNX Runtime captures CUDA graphs only of graphs without control flow (If, Loop, Scan). The heads choose
greedy or sampling with an `If` on `temperature == 0` (heads.py); a request's mode is fixed for its whole
decode, so a device backend runs greedy requests on this form (capturable) and sampling ones on the graph
as exported. Only the graph structure changes: the weights stay in the pack's external data files, read in
place (`session.model_external_initializers_file_folder_path`).

    If(temperature == 0, then=greedy, else=sampling) -> outs
      becomes   greedy's nodes (names are unique across branches: one GraphBuilder counter)
                Identity(greedy's outputs) -> outs
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import helper

from specpack import names

HEAD_OUTPUTS = ({names.TOKEN, names.PROBS}, {names.N_ACCEPTED, names.NEXT_TOKEN},  # draft head, verify head,
                {names.N_ACCEPTED, names.NEXT_TOKEN, names.PATH})                  # tree verify head


def greedy_form(path: Path, data: bytes | None = None) -> bytes:
    """The graph at `path` (weights not loaded; or its bytes, `data`, already read) with its head's If inlined as
    the greedy branch, serialized.

    Raises ValueError when the graph has no head If or keeps other control flow."""
    model = onnx.load_from_string(data) if data is not None else onnx.load(str(path), load_external_data=False)
    graph = model.graph
    nodes: list[onnx.NodeProto] = []
    inlined = 0
    for node in graph.node:
        if node.op_type == "If" and set(node.output) in HEAD_OUTPUTS:
            then = next(a.g for a in node.attribute if a.name == "then_branch")  # the greedy branch (heads.py)
            nodes.extend(then.node)
            graph.initializer.extend(then.initializer)
            nodes.extend(helper.make_node("Identity", [out.name], [name], name=f"greedy_{name}")
                         for out, name in zip(then.output, node.output, strict=True))
            inlined += 1
        else:
            nodes.append(node)
    control = [n.name or n.op_type for n in nodes if n.op_type in ("If", "Loop", "Scan")]
    if inlined != 1 or control:
        raise ValueError(f"{path.name}: expected one head If and no other control flow, found {inlined} head If "
                         f"and {control}")
    del graph.node[:]
    graph.node.extend(nodes)
    return model.SerializeToString()
