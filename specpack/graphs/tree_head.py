"""The tree verify head: acceptance over a token tree inside the graph, loop-free. The graph form of tree_oracle.py.

Bit for bit the oracle's verdict on ONNX Runtime's CPU EP (tests/graphs/test_tree_head.py), for the greedy rule and
the "deterministic" rule (n-gram tries, a draft's top-w: what EAGLE and SGLang ship); the drawn rules are in the
oracle only (docs/trees.md, "What remains"). The tree mask helpers (ancestor mask, depths, the run's row mask) are
here too: what the target's tree-masked attention will be built from.

Inputs beside the verify head's (heads.py) and outputs, T nodes, T + 1 rows (row 0: the root, the last committed
token; row i + 1: node i), T up to `max_nodes` (the pointer-doubling rounds are unrolled for it):

    input_ids    int64 [1, S]      ends with the T node tokens
    parents      int64 [1, T]      topological (parents[i] < i; not checked here), -1: the root
    uniforms     fp32  [1, T+1]    u[i] node i's test, u[T] the final draw (a chain: oracle.verify's)
    temperature, top_k, top_p
    -> n_accepted  int64 [1]       nodes on the accepted path
    -> next_token  int64 [1]       drawn after the deepest accepted node
    -> path        int64 [1, T+1]  the accepted rows, root first (0, then node + 1 for each node), -1 padded
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import onnx
from onnx import TensorProto, helper

from specpack import names
from specpack.graphs import sampling_graph as sg
from specpack.graphs.heads import HeadIO, Transform, head_model
from specpack.graphs.onnx_builder import FLOAT, INT64, INT64_MAX, GraphBuilder, Value, tensor_info
from specpack.limits import TREE_NODES_MAX

MAX_NODES = TREE_NODES_MAX  # the most nodes a tree head is built for (spec-export --max-tree-nodes, issue 23)


def doubling_rounds(max_nodes: int) -> int:
    """Pointer-doubling rounds that reach every ancestor in a tree of up to max_nodes nodes (depth <= max_nodes)."""
    return max(1, math.ceil(math.log2(max(max_nodes - 1, 1))))


def ancestor_mask(b: GraphBuilder, parents: Value, max_nodes: int = MAX_NODES) -> Value:
    """tree_oracle.ancestors as fp32 1 / 0: parents int64 [T] -> A [T, T], A[j, i] = 1 iff i is j or an ancestor of j.

    Pointer doubling, a fixed unroll (no Loop: CUDA graphs capture it), the root's children pointing at themselves:

        P = parents < 0 ? self : parents                                      [T]
        A = (i == j) or (i == P[j])                                           [T,T] ancestors within 1 step
        repeat doubling_rounds(max_nodes) times:                              within 2^r steps after r rounds
            A = max(A, A[P]);  P = P[P]
    """
    index = _range(b, parents)  # [T]
    up = b.op("Where", b.op("Less", parents, b.const(0)), index, parents)  # [T] P, roots' children -> self
    mask = b.op("Cast", b.op("Or", _outer("Equal", b, index, index), _outer("Equal", b, up, index)), to=FLOAT)
    for _ in range(doubling_rounds(max_nodes)):
        mask = b.op("Max", mask, b.op("Gather", mask, up, axis=0))  # [T, T] A[j] | A[P[j]]
        up = b.op("Gather", up, up, axis=0)  # [T] P[P[j]]
    return mask


def depths(b: GraphBuilder, ancestors: Value) -> Value:
    """Depth of each node, int64 [T] (1 for the root's children): the row sums of the ancestor mask. The run's
    positions are L + [0, depths] (L: the root's position)."""
    return b.op("Cast", b.reduce("ReduceSum", ancestors, axis=1, keepdims=False), to=INT64)


def row_mask(b: GraphBuilder, ancestors: Value) -> Value:
    """tree_oracle.tree_attention_mask as fp32 1 / 0: [T, T] -> [T + 1, T + 1] (every row sees the root, row 0).

        [[1, 0 ... 0],
         [1,    A    ]]
    """
    padded = b.op("Pad", ancestors, b.const([1, 0, 0, 0]))  # [T+1, T] a zero row on top
    ones = b.op("ConstantOfShape", b.op("Concat", b.op("Shape", padded, start=0, end=1), b.const([1]), axis=0),
                value=onnx.numpy_helper.from_array(np.ones(1, np.float32)))  # [T+1, 1]
    return b.op("Concat", ones, padded, axis=1)


def add_tree_verify_head(b: GraphBuilder, logits: Value, logits_type: int = FLOAT, vocab: int | None = None,
                         transform: Transform = sg.transform, max_nodes: int = MAX_NODES) -> None:
    """Accept a root path of the tree (the last T of input_ids, shaped by `parents`) and draw the next token.

    `logits` [1, T+1, V]: the last T + 1 positions (`last_rows`). Loop-free: every node is tested at once, and a
    node is on the path when it and each of its ancestors is its parent's chosen child.

        x = Cast(logits[0], fp32);  tok = input_ids[0, S-T:];  row = parents + 1      [T+1,V], [T], [T]
        B[j, i] = parents[i] == parents[j] and i < j                                   [T,T] earlier siblings
        If temperature == 0:  best = ArgMax(x);  test = tok == best[row]               [T+1], [T]
        else:                 p = transform(x);  P = p[row, tok]                       [T+1,V], [T]
                              P = P * not(any_i B[j,i] and tok_i == tok_j)             a repeated sibling: 0
                              S = CumSum([0 | B * P], axis 1)[:, -1]                   [T] the oracle's order
                              test = u[:T] * (1 - S) < P  and  P > 0                   u < r_{i-1}(c_i)
        chosen = test and not any_i (B[j, i] and test_i)                               first passing sibling
        on_path = all_i (A[j, i] -> chosen_i);  n = count(on_path)                     A = ancestor_mask
        path[d] = d == 0 ? 0 : d <= n ? 1 + (the on-path node of depth d) : -1         [T+1]
        a = path[n]                                                                     deepest accepted row
        greedy:  next = best[a]
        else:    residual = p[a] with the tokens of a's children zeroed (ScatterElements, reduction "mul")
                 residual += p[a] if max(residual) == 0;  next = draw(residual, u[T])
        -> n_accepted, next_token, path
    """
    count = b.op("Shape", names.PARENTS, start=1, end=2)  # [1] T
    x = b.op("Squeeze", logits, b.const([0]))  # [T+1, V]
    x = x if logits_type == FLOAT else b.op("Cast", x, to=FLOAT)
    seq_len = b.op("Shape", names.INPUT_IDS, start=1, end=2)  # [1] S
    tokens = b.op("Squeeze", b.slice(names.INPUT_IDS, b.op("Sub", seq_len, count), INT64_MAX, axis=1),
                  b.const([0]))  # [T]
    parents = b.op("Squeeze", names.PARENTS, b.const([0]))  # [T]
    rows = b.op("Add", parents, b.const(1))  # [T] the row each node is tested at: its parent's
    index = _range(b, parents)  # [T]
    before = b.op("And", _outer("Equal", b, parents, parents), _outer("Greater", b, index, index))  # [T, T] B
    ancestors = ancestor_mask(b, parents, max_nodes)  # [T, T]

    def greedy(sub: GraphBuilder) -> list[Value]:
        best = sub.op("ArgMax", x, axis=-1, keepdims=0)  # [T+1]
        test = sub.op("Equal", tokens, sub.op("Gather", best, rows, axis=0))  # [T]
        n, path, last = _accepted_path(sub, test, before, ancestors, index)
        return [n, sub.op("Gather", best, last, axis=0), path]

    def sample(sub: GraphBuilder) -> list[Value]:
        p = transform(sub, x, names.TEMPERATURE, names.TOP_K, names.TOP_P, vocab)  # [T+1, V]
        u = sub.op("Squeeze", names.UNIFORMS, sub.const([0]))  # [T+1]
        at = sub.op("Concat", sub.op("Unsqueeze", rows, sub.const([1])), sub.op("Unsqueeze", tokens, sub.const([1])),
                    axis=1)  # [T, 2]
        repeated = sub.op("And", before, _outer("Equal", sub, tokens, tokens))  # [T, T]
        mass = sub.op("Mul", sub.op("GatherND", p, at), _none(sub, repeated))  # [T] p(c_i), 0 when repeated
        earlier = sub.op("Mul", sub.op("Cast", before, to=FLOAT), sub.op("Unsqueeze", mass, sub.const([0])))  # [T, T]
        zero_column = sub.op("Expand", sub.const([[0.0]], np.float32),
                             sub.op("Concat", sub.op("Shape", earlier, start=0, end=1), sub.const([1]), axis=0))
        removed = sub.op("CumSum", sub.op("Concat", zero_column, earlier, axis=1), sub.const(1))  # [T, T+1] sequential
        removed = sub.op("Squeeze", sub.slice(removed, -1, INT64_MAX, axis=1), sub.const([1]))  # [T] S_i
        remaining = sub.op("Sub", sub.const(1.0, np.float32), removed)  # [T] 1 - S_i
        lhs = sub.op("Mul", sub.slice(u, 0, count, axis=0), remaining)  # [T] u_i * (1 - S_i)
        test = sub.op("And", sub.op("Less", lhs, mass), sub.op("Greater", mass, sub.const(0.0, np.float32)))  # [T]
        n, path, last = _accepted_path(sub, test, before, ancestors, index)
        row = sub.op("Gather", p, last, axis=0)  # [1, V] p at the deepest accepted node
        residual = sub.op("ScatterElements", row, sub.op("Unsqueeze", tokens, sub.const([0])),
                          sub.op("Unsqueeze", _keep(sub, rows, last), sub.const([0])), axis=1, reduction="mul")
        empty = sub.op("Cast", sub.op("Equal", sub.reduce("ReduceMax", residual, axis=-1), sub.const(0.0, np.float32)),
                       to=FLOAT)  # [1, 1]
        dist = sub.op("Add", residual, sub.op("Mul", empty, row))  # [1, V] residual + 0 * row is exact
        return [n, sg.draw(sub, dist, sub.slice(u, count, INT64_MAX, axis=0), vocab), path]

    b.if_(b.op("Equal", names.TEMPERATURE, b.const([0.0], np.float32)), greedy, sample, [INT64, INT64, INT64],
          out_names=[names.N_ACCEPTED, names.NEXT_TOKEN, names.PATH])


def _accepted_path(b: GraphBuilder, test: Value, before: Value, ancestors: Value,
                   index: Value) -> tuple[Value, Value, Value]:
    """From each node's test [T] bool: n_accepted [1], path [T+1] (module docstring), the deepest accepted row [1]."""
    passed = b.op("Cast", test, to=FLOAT)  # [T]
    earlier_passed = _matvec(b, b.op("Cast", before, to=FLOAT), passed)  # [T] passing earlier siblings (exact)
    chosen = b.op("And", test, b.op("Equal", earlier_passed, b.const(0.0, np.float32)))  # [T]
    not_chosen = b.op("Sub", b.const(1.0, np.float32), b.op("Cast", chosen, to=FLOAT))  # [T]
    on_path = b.op("Equal", _matvec(b, ancestors, not_chosen), b.const(0.0, np.float32))  # [T]
    on = b.op("Cast", on_path, to=FLOAT)  # [T]
    n = sg.count(b, on_path)  # [1]
    depth = b.op("Cast", b.reduce("ReduceSum", ancestors, axis=1, keepdims=False), to=FLOAT)  # [T] 1..T
    levels = b.op("Cast", b.op("Range", b.const(0), b.op("Add", b.op("Squeeze", b.op("Shape", test), b.const([0])),
                                                               b.const(1)), b.const(1)), to=FLOAT)  # [T+1] 0..T
    at_level = b.op("Mul", b.op("Cast", _outer("Equal", b, levels, depth), to=FLOAT),
                    b.op("Unsqueeze", on, b.const([0])))  # [T+1, T] the on-path node at each depth
    node_row = b.op("Cast", b.op("Add", index, b.const(1)), to=FLOAT)  # [T] 1..T
    rows = _matvec(b, at_level, node_row)  # [T+1] (row 0: 0, the root)
    valid = b.op("Cast", b.op("LessOrEqual", levels, b.op("Cast", n, to=FLOAT)), to=FLOAT)  # [T+1] 1 / 0
    path = b.op("Cast", b.op("Add", b.op("Mul", rows, valid), b.op("Sub", valid, b.const(1.0, np.float32))),
                to=INT64)  # [T+1] rows, -1 past n
    return n, b.op("Unsqueeze", path, b.const([0])), b.op("Gather", path, n, axis=0)


def _matvec(b: GraphBuilder, matrix: Value, vector: Value) -> Value:
    """matrix [J, I] times vector [I] -> [J], as a row sum of products: exact on the small integers these hold, and
    defined for I = 0 on every EP (ONNX Runtime's CUDA MatMul refuses the empty operands of a T = 0 tree step)."""
    return b.reduce("ReduceSum", b.op("Mul", matrix, b.op("Unsqueeze", vector, b.const([0]))), axis=-1,
                    keepdims=False)


def _keep(b: GraphBuilder, rows: Value, last: Value) -> Value:
    """1 for nodes that are not children of the row `last`, 0 for its children: fp32 [T]."""
    return b.op("Sub", b.const(1.0, np.float32), b.op("Cast", b.op("Equal", rows, last), to=FLOAT))


def _none(b: GraphBuilder, flags: Value) -> Value:
    """1 where no flag of the row is set, else 0: bool [T, T] -> fp32 [T]."""
    return b.op("Sub", b.const(1.0, np.float32),
                b.reduce("ReduceMax", b.op("Cast", flags, to=FLOAT), axis=-1, keepdims=False))


def _range(b: GraphBuilder, x: Value) -> Value:
    """0..len(x)-1, int64 [len(x)]."""
    return b.op("Range", b.const(0), b.op("Squeeze", b.op("Shape", x), b.const([0])), b.const(1))


def _outer(op_type: str, b: GraphBuilder, column: Value, row: Value) -> Value:
    """op(column[j], row[i]) for every j, i: [J] x [I] -> [J, I]."""
    return b.op(op_type, b.op("Unsqueeze", column, b.const([1])), b.op("Unsqueeze", row, b.const([0])))


def _tree_rows(b: GraphBuilder) -> Value:
    return b.op("Add", b.op("Shape", names.PARENTS, start=1, end=2), b.const([1]))  # [1] T + 1


def tree_verify_head_io() -> HeadIO:
    """The tree head's inputs beside logits and input_ids (parents, uniforms, sampling inputs) and its outputs."""
    inputs = [tensor_info(names.PARENTS, INT64, [1, "T"]), tensor_info(names.UNIFORMS, FLOAT, [1, "T_plus_1"]),
              tensor_info(names.TEMPERATURE, FLOAT, [1]), tensor_info(names.TOP_K, INT64, [1]),
              tensor_info(names.TOP_P, FLOAT, [1])]
    outputs = [tensor_info(names.N_ACCEPTED, INT64, [1]), tensor_info(names.NEXT_TOKEN, INT64, [1]),
               tensor_info(names.PATH, INT64, [1, "T_plus_1"])]
    return HeadIO(inputs, outputs, _tree_rows)


def tree_verify_head_model(opset: int = 18, logits_type: int = TensorProto.FLOAT, vocab: int | None = None,
                           max_nodes: int = MAX_NODES) -> onnx.ModelProto:
    """The tree head alone: logits [1, S, V] (reads the last T + 1 rows), input_ids [1, S] + its inputs
    -> n_accepted, next_token, path."""
    return head_model(partial(add_tree_verify_head, max_nodes=max_nodes), tree_verify_head_io(), logits_type, opset,
                      vocab, [tensor_info(names.INPUT_IDS, INT64, [1, "S"])])


def tree_mask_model(opset: int = 18, max_nodes: int = MAX_NODES) -> onnx.ModelProto:
    """The tree mask helpers alone: parents int64 [T] -> ancestors fp32 [T, T], depths int64 [T], row_mask fp32
    [T + 1, T + 1]."""
    b = GraphBuilder(opset)
    ancestors = ancestor_mask(b, names.PARENTS, max_nodes)
    b.op("Identity", ancestors)
    b.nodes[-1].output[0] = "ancestors"
    b.op("Identity", depths(b, ancestors))
    b.nodes[-1].output[0] = "depths"
    b.op("Identity", row_mask(b, ancestors))
    b.nodes[-1].output[0] = "row_mask"
    outputs = [tensor_info("ancestors", FLOAT, ["T", "T"]), tensor_info("depths", INT64, ["T"]),
               tensor_info("row_mask", FLOAT, ["T_plus_1", "T_plus_1"])]
    return _model(b, [tensor_info(names.PARENTS, INT64, ["T"])], outputs, opset)


def _model(b: GraphBuilder, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           opset: int) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(b.nodes, "tree_masks", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", opset)], producer_name="specpack")
    model.ir_version = min(model.ir_version, 10)  # what onnxruntime >= 1.20 reads
    onnx.checker.check_model(model)
    return model
