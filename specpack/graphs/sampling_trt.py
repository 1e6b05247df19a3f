"""The sampling transform in TensorRT's ops: the heads of the `tensorrt` graph form (export/graph_form.py).

sampling_graph.py is exact with the oracle bit for bit on ONNX Runtime's CPU EP, with two things TensorRT has
not: fp64 (its exp) and TopK over more than 3839 entries (its top-p tiers go to 8192 and the whole vocabulary;
its first TopK is unsorted). This form keeps the same function with other rounding, so it agrees with the
oracle in distribution, not bit for bit:

- exp is fp32 Exp;
- one sorted TopK of a constant K = min(V, TOPK_LIMIT) candidates; where the answer lies beyond them (top_k > K,
  or top-p needs more than the K largest logits) a bisection over the logit values finds the threshold:

    lo, hi = a threshold that keeps enough, one that keeps too little            [N, 1] each
    Loop BISECT_STEPS times:  mid = (lo + hi) / 2;  ok = enough(x >= mid)
                              lo = ok ? mid : lo;   hi = ok ? hi : mid
    threshold = enough(x >= hi) ? hi : lo    (hi kept enough from the start: ties at the K-th logit)

  `enough` is count(x >= t) >= top_k for top-k, and mass(x >= t) >= top_p * mass for top-p; both only grow
  as t falls, so {x >= lo} is the oracle's kept set once no logit lies between lo and hi. 64 halvings of a
  range of finite logits leave an interval far below the spacing of distinct fp32 logits (of magnitude >=
  2^-40 over a range <= 2^24). Logits whose exp underflows have no mass, so which of them are kept does
  not change the distribution.

The other graph pieces (sums, cdf, draw, acceptance) are sampling_graph.py's: they use no fp64 and no TopK.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import helper

from specpack.graphs import sampling_graph as sg
from specpack.graphs.onnx_builder import BOOL, FLOAT, INT64, INT64_MAX, GraphBuilder, Value

TOPK_LIMIT = 3839  # onnx-tensorrt docs/operators.md: TopK's K "must be less than 3840" (and sorted = 1)
BISECT_STEPS = 64
Enough = Callable[[GraphBuilder, Value], Value]  # (builder, threshold [N, 1]) -> bool [N, 1]


def exp_fp32(b: GraphBuilder, x: Value) -> Value:
    """exp in fp32 (TensorRT has no fp64)."""
    return b.op("Exp", x)


def candidates_k(vocab: int | None, limit: int = TOPK_LIMIT) -> int:
    """K of the one TopK: min(V, limit), a constant (TensorRT checks K against its limit at build time)."""
    return limit if vocab is None else min(vocab, limit)


def bisect(b: GraphBuilder, lo: Value, hi: Value, enough: Enough, steps: int = BISECT_STEPS) -> Value:
    """The threshold t in [lo, hi] with enough(t) and nothing between it and the largest such value: -> [N, 1].

    lo, hi [N, 1]: enough(lo) (or lo keeps every logit with mass), hi above the answer unless enough(hi).
    Sketch in the module docstring; a Loop with a constant trip count and [N, 1] carried values.
    """
    body = GraphBuilder(b.opset, b.prefix, b._counter)
    it, cond, lo_in, hi_in = (body.fresh(n) for n in ("iter", "cond", "lo", "hi"))
    mid = body.op("Mul", body.op("Add", lo_in, hi_in), body.const(0.5, np.float32))  # [N, 1]
    ok = enough(body, mid)  # [N, 1] bool
    outs = [body.op("Identity", cond), body.op("Where", ok, mid, lo_in), body.op("Where", ok, hi_in, mid)]
    graph = helper.make_graph(
        body.nodes, b.fresh("bisect_body"),
        [helper.make_tensor_value_info(it, INT64, []), helper.make_tensor_value_info(cond, BOOL, []),
         helper.make_tensor_value_info(lo_in, FLOAT, None), helper.make_tensor_value_info(hi_in, FLOAT, None)],
        [helper.make_tensor_value_info(outs[0], BOOL, []), helper.make_tensor_value_info(outs[1], FLOAT, None),
         helper.make_tensor_value_info(outs[2], FLOAT, None)])
    lo_out, hi_out = b.op("Loop", b.const(steps), b.const(True, np.bool_), lo, hi, outputs=2, body=graph)
    return b.op("Where", enough(b, hi_out), hi_out, lo_out)


def keep_threshold(b: GraphBuilder, x: Value, e: Value, top_k: Value, top_p: Value, top_k_on: Value,
                   top_p_on: Value, vocab: int | None, limit: int = TOPK_LIMIT) -> Value:
    """sampling_graph.keep_threshold in TensorRT's ops: the smallest logit kept, per row: [N, V] -> [N, 1].

        values, indices = TopK(x, K = min(V, limit), sorted)                         [N,K]
        kth = top-k on ? (top_k <= K ? values[:, top_k - 1] : bisect(count)) : -inf  [N,1]
        If top-p on:  max(kth, top-p cutoff among the K candidates, else bisect(mass))
        else:         kth
    """
    k = candidates_k(vocab, limit)
    kk = b.op("Min", sg.vocab_size(b, x, vocab), b.const([k])) if vocab is None else b.const([k])  # [1] K
    values, indices = b.op("TopK", x, kk, axis=-1, largest=1, sorted=1, outputs=2)  # [N, K] descending
    finite = b.op("Where", b.op("IsInf", x, detect_positive=0), b.const([[np.inf]], np.float32), x)  # [N, V]
    lowest = b.reduce("ReduceMin", finite, axis=-1)  # [N, 1] the smallest finite logit
    kth = _top_k_threshold(b, x, values, kk, lowest, top_k, top_k_on)  # [N, 1]

    def with_top_p(sub: GraphBuilder) -> list[Value]:
        cutoff = _top_p_cutoff(sub, x, e, values, indices, kk, kth, lowest, top_p, vocab)
        return [sub.op("Max", kth, cutoff)]

    return b.if_(top_p_on, with_top_p, lambda _: [kth], [FLOAT])[0]


def _top_k_threshold(b: GraphBuilder, x: Value, values: Value, kk: Value, lowest: Value, top_k: Value,
                     top_k_on: Value) -> Value:
    """The top_k-th largest logit per row [N, 1]; -inf when top-k is off."""
    last = b.op("Sub", kk, b.const([1]))  # [1] K - 1
    col = b.op("Min", b.op("Max", b.op("Sub", top_k, b.const([1])), b.const([0])), last)  # [1]
    kth = b.op("Where", top_k_on, b.slice(values, col, b.op("Add", col, b.const([1])), axis=-1),
               b.const([[-np.inf]], np.float32))  # [N, 1]
    beyond = b.op("And", top_k_on, b.op("Greater", top_k, kk))  # [1] the k-th lies past the candidates

    def by_count(sub: GraphBuilder) -> list[Value]:
        k_float = sub.op("Cast", top_k, to=FLOAT)  # [1]

        def enough(s: GraphBuilder, t: Value) -> Value:
            kept = s.reduce("ReduceSum", s.op("Cast", s.op("GreaterOrEqual", x, t), to=FLOAT), axis=-1)  # [N, 1]
            return s.op("GreaterOrEqual", kept, k_float)

        return [bisect(sub, lowest, sub.slice(values, -1, INT64_MAX, axis=-1), enough)]

    return b.if_(beyond, by_count, lambda _: [kth], [FLOAT])[0]


def _top_p_cutoff(b: GraphBuilder, x: Value, e: Value, values: Value, indices: Value, kk: Value, kth: Value,
                  lowest: Value, top_p: Value, vocab: int | None) -> Value:
    """The smallest logit top-p keeps of the top-k distribution, per row [N, 1] (sampling_graph.top_p_cutoff).

        e_k = e * (x >= kth);  s = fsum(e_k);  cum = CumSum(e_k[candidates] / s)        [N,V], [N,1], [N,K]
        c = min(count(cum < top_p), K - 1);  cutoff = candidates[c]                       [N,1]
        rows whose K candidates hold less than top_p (and still have mass at the K-th): bisect(mass)
    """
    e_k = b.op("Mul", e, b.op("Cast", b.op("GreaterOrEqual", x, kth), to=FLOAT))  # [N, V] top-k distribution
    s = sg.fsum(b, e_k, vocab)  # [N, 1]
    probs = b.op("Div", b.op("GatherElements", e_k, indices, axis=-1), s)  # [N, K]
    cum = b.op("CumSum", probs, b.const(-1))  # [N, K] inclusive
    c = b.op("Min", sg.count(b, b.op("Less", cum, top_p), axis=-1), b.op("Sub", kk, b.const([1])))  # [N, 1]
    cutoff = b.op("GatherElements", values, c, axis=-1)  # [N, 1]
    covered = b.op("GreaterOrEqual", b.slice(cum, -1, INT64_MAX, axis=-1), top_p)  # [N, 1]
    exhausted = b.op("Equal", b.slice(probs, -1, INT64_MAX, axis=-1), b.const(0.0, np.float32))  # [N, 1]
    whole = b.op("GreaterOrEqual", kk, sg.vocab_size(b, x, vocab))  # [1] the candidates are the vocabulary
    done = b.op("Or", b.op("Or", covered, exhausted), whole)  # [N, 1]
    all_done = b.op("Equal", b.op("ReduceMin", b.op("Cast", done, to=FLOAT), keepdims=0),
                    b.const(1.0, np.float32))  # []

    def by_mass(sub: GraphBuilder) -> list[Value]:
        need = sub.op("Mul", s, top_p)  # [N, 1]

        def enough(s2: GraphBuilder, t: Value) -> Value:  # a plain ReduceSum: its order need not match fsum's
            kept = s2.op("Mul", e_k, s2.op("Cast", s2.op("GreaterOrEqual", x, t), to=FLOAT))  # [N, V]
            return s2.op("GreaterOrEqual", s2.reduce("ReduceSum", kept, axis=-1), need)  # [N, 1]

        start = sub.op("Max", lowest, kth)  # [N, 1] keeps the whole top-k distribution
        found = bisect(sub, start, sub.slice(values, -1, INT64_MAX, axis=-1), enough)  # [N, 1]
        return [sub.op("Where", done, cutoff, found)]

    return b.if_(all_done, lambda _: [cutoff], by_mass, [FLOAT])[0]


def transform(b: GraphBuilder, logits: Value, temperature: Value, top_k: Value, top_p: Value,
              vocab: int | None) -> Value:
    """sampling_graph.transform with fp32 exp and the threshold above: fp32 logits [N, V] -> probs [N, V]."""
    return sg.transform(b, logits, temperature, top_k, top_p, vocab, exp=exp_fp32, keep=keep_threshold)
