"""The plain form of a batched verify graph (verify_batched.onnx): its head's Scan over rows replaced by the acceptance
of every row at once, greedy rows and plain sampling rows (temperature only: sampling_form.py) alike, so a batch with
sampling rows that filter nothing has no control flow and is captured like the greedy form (batched_greedy_form.py).

    Scan(x [B, K+1, V], drafts [B, K], q [B, K, V], u [B, K+1], counts [B], temperature, top_k, top_p)  (batched_head.py)
      becomes, per row b at once (k_b = counts[b]; rows past k_b are pads, never read):
        greedy:   batched_greedy_form's acceptance                                       n_g [B], next_g [B]
        sampling: t = temperature (1 where 0: that row's sampled verdict is dropped)
                  p = exp32(x / t - max) / fsum(...)                                      [B, K+1, V]
                  n_s = leading (u_j * q_j(d_j) < p_j(d_j) and j < k_b)                   [B]
                  residual = max(0, p[n_s] - (q[n_s] if n_s < k_b else 0)), p[n_s] if it is all 0
                  next_s = draw(residual, u[k_b])                                          [B]
        n_accepted, next_token = greedy where temperature == 0, else sampling
Each row's arithmetic is its row's in the Scan (heads.verify_chain's sampling branch with the transform unfiltered;
sampling_graph's blocked sums and cdf on that row alone), so the verdicts are the Scan's bit for bit on the CPU EP
(tests/graphs/test_batched_plain_form.py). A batch with a row that filters (top-k, top-p) runs on the graph as exported.
top_k and top_p are no longer inputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from specpack import names
from specpack.graphs import sampling_graph as sg
from specpack.graphs.batched_greedy_form import _greedy_acceptance, rewrite_head
from specpack.graphs.onnx_builder import FLOAT, INT64, INT64_MAX, GraphBuilder, Value

PLAIN_DROPPED = (names.TOP_K, names.TOP_P)  # inputs the plain form no longer reads


def batched_plain_form(path: Path, data: bytes | None = None) -> bytes:
    """The graph at `path` (weights not loaded; or its bytes, `data`) in its plain form, serialized. ValueError when it
    has no batched verify head (one Scan feeding n_accepted and next_token) or keeps other control flow."""
    opset = (onnx.load_from_string(data) if data is not None
             else onnx.load(str(path), load_external_data=False)).opset_import[0].version
    return rewrite_head(path, data, lambda scan: _plain_acceptance(scan, opset))


def _plain_acceptance(scan: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    """Each row's verdict from the Scan's inputs: the greedy acceptance's where temperature is 0, else the sampling
    one's (module docstring)."""
    x, drafts, counts = scan.input[0], scan.input[1], scan.input[4]
    greedy = [_renamed(n, {names.N_ACCEPTED: "batched_plain_greedy_n", names.NEXT_TOKEN: "batched_plain_greedy_next"})
              for n in _greedy_acceptance(x, drafts, counts)]
    b = GraphBuilder(opset, "batched_plain/")
    n_s, next_s = _sampling_acceptance(b, x, drafts, counts)
    is_greedy = b.op("Equal", names.TEMPERATURE, b.const(0.0, np.float32))  # [B] bool
    b.nodes.append(onnx.helper.make_node("Where", [is_greedy, "batched_plain_greedy_n", n_s], [names.N_ACCEPTED],
                                         name=b.fresh("Where")))
    b.nodes.append(onnx.helper.make_node("Where", [is_greedy, "batched_plain_greedy_next", next_s],
                                         [names.NEXT_TOKEN], name=b.fresh("Where")))
    return [*greedy, *b.nodes]


def _renamed(node: onnx.NodeProto, names_to: dict[str, str]) -> onnx.NodeProto:
    """The node with its outputs renamed (the greedy verdicts become inputs of the per-row choice)."""
    out = onnx.NodeProto()
    out.CopyFrom(node)
    for i, name in enumerate(out.output):
        out.output[i] = names_to.get(name, name)
    return out


def _sampling_acceptance(b: GraphBuilder, x: Value, drafts: Value, counts: Value) -> tuple[Value, Value]:
    """Every row's plain sampling verdict (module docstring): x [B, K+1, V] fp32 -> n [B], next token [B]."""
    q, u = names.DRAFT_PROBS, names.UNIFORMS  # [B, K, V], [B, K+1]
    t = b.op("Where", b.op("Equal", names.TEMPERATURE, b.const(0.0, np.float32)), b.const(1.0, np.float32),
             names.TEMPERATURE)  # [B]
    scaled = b.op("Div", x, b.op("Unsqueeze", t, b.const([1, 2])))  # [B, K+1, V]
    e = sg.exp32(b, b.op("Sub", scaled, b.reduce("ReduceMax", scaled, -1)))  # [B, K+1, V]
    shape = b.op("Shape", e)  # [3]
    flat = b.op("Reshape", e, b.op("Concat", b.const([-1]), b.op("Shape", e, start=2), axis=0))  # [B (K+1), V]
    p = b.op("Reshape", b.op("Div", flat, sg.fsum(b, flat, None)), shape)  # [B, K+1, V]
    k = b.op("Shape", q, start=1, end=2)  # [1] K
    index = b.op("Unsqueeze", drafts, b.const([2]))  # [B, K, 1]
    p_x = b.op("Squeeze", b.op("GatherElements", b.slice(p, 0, k, axis=1), index, axis=2), b.const([2]))  # [B, K]
    q_x = b.op("Squeeze", b.op("GatherElements", q, index, axis=2), b.const([2]))  # [B, K]
    lhs = b.op("Mul", b.slice(u, 0, k, axis=1), q_x)  # [B, K] u_j q_j(d_j)
    j = b.op("Range", b.const(0), b.op("Squeeze", k, b.const([0])), b.const(1))  # [K]
    drafted = b.op("Less", j, b.op("Unsqueeze", counts, b.const([1])))  # [B, K] j < k_b
    accepted = b.op("And", b.op("Less", lhs, p_x), drafted)  # [B, K]
    rejected = b.op("Cast", b.op("Not", accepted), to=FLOAT)
    leading = b.op("Equal", b.op("CumSum", rejected, b.const(1)), b.const(0.0, np.float32))  # [B, K]
    n = b.op("Cast", b.reduce("ReduceSum", b.op("Cast", leading, to=FLOAT), 1), to=INT64)  # [B, 1]
    at_n = b.op("Expand", b.op("Unsqueeze", n, b.const([2])),
                b.op("Concat", b.const([1, 1]), b.op("Shape", p, start=2), axis=0))  # [B, 1, V]
    p_n = b.op("GatherElements", p, at_n, axis=1)  # [B, 1, V]
    zeros = b.op("ConstantOfShape", b.op("Concat", b.op("Shape", q, start=0, end=1), b.const([1]),
                                         b.op("Shape", q, start=2), axis=0))  # [B, 1, V]
    q_n = b.op("GatherElements", b.op("Concat", q, zeros, axis=1), at_n, axis=1)  # [B, 1, V] (K: the zero row)
    q_n = b.op("Where", b.op("Unsqueeze", _bonus_mask(b, n, counts), b.const([2])), q_n,
               b.const(0.0, np.float32))  # [B, 1, V]
    residual = b.op("Squeeze", b.op("Relu", b.op("Sub", p_n, q_n)), b.const([1]))  # [B, V]
    p_n = b.op("Squeeze", p_n, b.const([1]))  # [B, V]
    empty = b.op("Cast", b.op("Equal", b.reduce("ReduceMax", residual, -1), b.const(0.0, np.float32)), to=FLOAT)
    dist = b.op("Add", residual, b.op("Mul", empty, p_n))  # [B, V]
    u_k = b.op("GatherElements", u, b.op("Unsqueeze", counts, b.const([1])), axis=1)  # [B, 1] u_{k_b}
    return b.op("Squeeze", n, b.const([1])), _draw_rows(b, dist, u_k)


def _bonus_mask(b: GraphBuilder, n: Value, counts: Value) -> Value:
    """[B, 1] n < k_b: the residual subtracts that drafted row's q; else (all k_b accepted) zeros, the bonus token's
    distribution being p itself (tests/graphs/test_batched_plain_form.py plants the defect of reading row k_b)."""
    return b.op("Less", n, b.op("Unsqueeze", counts, b.const([1])))


def _draw_rows(b: GraphBuilder, dist: Value, u: Value) -> Value:
    """sampling_graph.draw on every row at once: dist [B, V], u [B, 1] -> [B]. Each row's cdf is fcdf's (the same
    blocked, transposed layout and order of sums), counted over that row alone."""
    blocks = b.op("Transpose", sg._blocks(b, dist, None, [0, -1, sg.SUM_BLOCK]), perm=[0, 2, 1])  # [B, SB, A]
    within = b.op("CumSum", blocks, b.const(1))  # [B, SB, A] prefix inside each block
    totals = b.slice(within, -1, INT64_MAX, axis=1)  # [B, 1, A]
    cdf = b.op("Add", within, b.op("CumSum", totals, b.const(2), exclusive=1))  # [B, SB, A]
    total = b.slice(b.slice(cdf, -1, INT64_MAX, axis=1), -1, INT64_MAX, axis=2)  # [B, 1, 1]
    threshold = b.op("Mul", b.op("Unsqueeze", u, b.const([2])), total)  # [B, 1, 1]
    below = b.op("ReduceSum", b.op("Cast", b.op("LessOrEqual", cdf, threshold), to=FLOAT), b.const([1, 2]),
                 keepdims=1)  # [B, 1, 1]
    mass = b.op("ReduceSum", b.op("Cast", b.op("Less", cdf, total), to=FLOAT), b.const([1, 2]), keepdims=1)
    token = b.op("Cast", b.op("Min", below, mass), to=INT64)  # [B, 1, 1]
    return b.op("Reshape", token, b.const([-1]))  # [B]
