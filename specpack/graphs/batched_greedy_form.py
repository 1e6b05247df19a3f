"""The greedy form of a batched verify graph (verify_batched.onnx): its head's Scan over rows replaced by the greedy
acceptance of every row at once, so the graph has no control flow and ONNX Runtime can capture it as a CUDA graph
(docs/batching.md, "On the GPU"). A batch whose rows are all greedy runs on it; any sampling row, on the graph as
exported.

    Scan(x [B, K+1, V], drafts [B, K], draft_probs, uniforms, counts [B], temperature, top_k, top_p)  (batched_head.py)
      becomes   best  = ArgMax(x)                                  [B, K+1]  (the Scan's greedy branch: heads.verify_chain)
                match = (drafts == best[:, :K]) and (j < counts)   [B, K]
                n_accepted = leading matches per row               [B]
                next_token = best[b, n_accepted[b]]                [B]
    K, read by the head from draft_probs' shape, is read from uniforms' ([B, K + 1]) instead, so draft_probs and the
    sampling inputs are no longer inputs: a greedy batch copies none of them in.

The weights stay in the pack's data files (only the structure changes, as greedy_form.py does for batch-1 graphs).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from specpack import names

SAMPLING_INPUTS = (names.DRAFT_PROBS, names.TEMPERATURE, names.TOP_K, names.TOP_P)  # read by sampling rows alone


def batched_greedy_form(path: Path, data: bytes | None = None) -> bytes:
    """The graph at `path` (weights not loaded; or its bytes, `data`) in its greedy form, serialized.

    Raises ValueError when the graph has no batched verify head (one Scan whose outputs become n_accepted and
    next_token) or keeps other control flow."""
    return rewrite_head(path, data, lambda scan: _greedy_acceptance(scan.input[0], scan.input[1], scan.input[4]),
                        _k_from_uniforms)


def rewrite_head(path: Path, data: bytes | None, head: Callable[[onnx.NodeProto], list[onnx.NodeProto]],
                 edit: Callable[[onnx.NodeProto], list[onnx.NodeProto]] = lambda node: [node]) -> bytes:
    """The batched verify graph with its head's Scan (and the two Squeezes after it) replaced by `head(scan)`'s nodes,
    which write n_accepted and next_token; `edit` rewrites each other node; then only the nodes the outputs need, and
    only the inputs they read. ValueError without that head, or with control flow left."""
    model = onnx.load_from_string(data) if data is not None else onnx.load(str(path), load_external_data=False)
    graph = model.graph
    heads = {names.N_ACCEPTED, names.NEXT_TOKEN}
    squeezes = [n for n in graph.node if n.op_type == "Squeeze" and set(n.output) & heads]
    scans = [n for n in graph.node if n.op_type == "Scan" and set(n.output) & {s.input[0] for s in squeezes}]
    if len(scans) != 1 or len(squeezes) != 2:
        raise ValueError(f"{path.name}: expected the batched verify head (one Scan feeding n_accepted and "
                         f"next_token), found {len(scans)} Scan and {len(squeezes)} Squeeze")
    dropped = {id(scans[0]), *(id(s) for s in squeezes)}
    nodes = [edited for n in graph.node if id(n) not in dropped for edited in edit(n)]
    nodes = _live([*nodes, *head(scans[0])], {o.name for o in graph.output})
    control = [n.name or n.op_type for n in nodes if n.op_type in ("If", "Loop", "Scan")]
    if control:
        raise ValueError(f"{path.name}: control flow left after the head: {control}")
    read = {i for n in nodes for i in n.input}
    kept_inputs = [i for i in graph.input if i.name in read]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.input[:]
    graph.input.extend(kept_inputs)
    return model.SerializeToString()


def _k_from_uniforms(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """Shape(draft_probs)[1:2] (K, batched_head._num_drafts) -> Shape(uniforms)[1:2] - 1 under the same output name:
    the same K, from an input a greedy batch binds anyway."""
    if node.op_type != "Shape" or node.input[0] != names.DRAFT_PROBS:
        return [node]
    start = next((a.i for a in node.attribute if a.name == "start"), 0)
    end = next((a.i for a in node.attribute if a.name == "end"), None)
    if (start, end) != (1, 2):
        raise ValueError(f"draft_probs read for more than K: {node.name} (start {start}, end {end})")
    k1, one = f"{node.output[0]}_k1", f"{node.output[0]}_one"
    return [helper.make_node("Shape", [names.UNIFORMS], [k1], name=f"{node.name}_k1", start=1, end=2),
            helper.make_node("Constant", [], [one], name=f"{node.name}_one",
                             value=helper.make_tensor(one, TensorProto.INT64, [1], [1])),
            helper.make_node("Sub", [k1, one], [node.output[0]], name=node.name)]


def _greedy_acceptance(x: str, drafts: str, counts: str) -> list[onnx.NodeProto]:
    """best = ArgMax(x); n_accepted, next_token per row (module docstring). Every K, 0 included."""
    p = "batched_greedy_"
    k1 = helper.make_node("Shape", [names.UNIFORMS], [p + "k1"], name=p + "k1", start=1, end=2)  # int64 [1] K + 1

    def const(name: str, values: list[int]) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [p + name], name=p + name,
                                value=helper.make_tensor(p + name, TensorProto.INT64, [len(values)], values))

    return [
        helper.make_node("ArgMax", [x], [p + "best"], name=p + "argmax", axis=-1, keepdims=0),   # [B, K+1]
        k1, const("zero", [0]), const("one", [1]), const("axis1", [1]),
        helper.make_node("Sub", [p + "k1", p + "one"], [p + "k"], name=p + "k"),                # [1] K
        helper.make_node("Slice", [p + "best", p + "zero", p + "k", p + "axis1"], [p + "best_k"],
                         name=p + "best_k"),                                                     # [B, K]
        helper.make_node("Equal", [drafts, p + "best_k"], [p + "same"], name=p + "same"),       # [B, K]
        helper.make_node("Squeeze", [p + "k", p + "zero"], [p + "k_scalar"], name=p + "k_scalar"),
        helper.make_node("Squeeze", [p + "zero", p + "zero"], [p + "zero_scalar"], name=p + "zero_scalar"),
        helper.make_node("Squeeze", [p + "one", p + "zero"], [p + "one_scalar"], name=p + "one_scalar"),
        helper.make_node("Range", [p + "zero_scalar", p + "k_scalar", p + "one_scalar"], [p + "j"], name=p + "j"),
        helper.make_node("Unsqueeze", [counts, p + "axis1"], [p + "counts"], name=p + "counts"),  # [B, 1]
        helper.make_node("Less", [p + "j", p + "counts"], [p + "drafted"], name=p + "drafted"),   # [B, K] j < k_b
        helper.make_node("And", [p + "same", p + "drafted"], [p + "match"], name=p + "match"),
        helper.make_node("Not", [p + "match"], [p + "miss"], name=p + "miss"),
        helper.make_node("Cast", [p + "miss"], [p + "miss_f"], name=p + "miss_f", to=TensorProto.FLOAT),
        helper.make_node("Squeeze", [p + "axis1", p + "zero"], [p + "axis1_scalar"], name=p + "axis1_scalar"),
        helper.make_node("CumSum", [p + "miss_f", p + "axis1_scalar"], [p + "misses"], name=p + "misses"),
        helper.make_node("Constant", [], [p + "fzero"], name=p + "fzero",
                         value=helper.make_tensor(p + "fzero", TensorProto.FLOAT, [], [0.0])),
        helper.make_node("Equal", [p + "misses", p + "fzero"], [p + "leading"], name=p + "leading"),
        helper.make_node("Cast", [p + "leading"], [p + "leading_i"], name=p + "leading_i", to=TensorProto.INT64),
        helper.make_node("ReduceSum", [p + "leading_i", p + "axis1"], [p + "n"], name=p + "n", keepdims=1),  # [B, 1]
        helper.make_node("GatherElements", [p + "best", p + "n"], [p + "next"], name=p + "next", axis=1),     # [B, 1]
        helper.make_node("Squeeze", [p + "n", p + "axis1"], [names.N_ACCEPTED], name=p + "n_accepted"),
        helper.make_node("Squeeze", [p + "next", p + "axis1"], [names.NEXT_TOKEN], name=p + "next_token"),
    ]


def _live(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """The nodes the graph's outputs need, in their order (the graph's, then the appended head's: topological)."""
    producer = {o: n for n in nodes for o in n.output}
    needed: set[int] = set()
    stack = [producer[o] for o in outputs if o in producer]
    while stack:
        node = stack.pop()
        if id(node) not in needed:
            needed.add(id(node))
            stack.extend(producer[i] for i in node.input if i in producer)
    return [n for n in nodes if id(n) in needed]
