"""The sampling transform and the inverse-CDF draw as ONNX nodes: the graph form of oracle.py.

Same fp32 rounding as the oracle step by step (exp in fp64 rounded once; sums and cdfs in the oracle's
fixed blocked order, with CumSum on its fast axis), so ONNX Runtime's CPU EP agrees with it bit for bit.
No `Where` with bool data (ONNX Runtime's CPU EP has none; a bool condition over float data is fine), no
random ops (uniforms are inputs), and counts are float sums (ReduceSum over int64 is 10x slower there).

`vocab` is V when the graph is built for one vocabulary (attach.py), None for any V (taken from shapes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from specpack.graphs.onnx_builder import DOUBLE, FLOAT, INT64, INT64_MAX, GraphBuilder, Value
from specpack.graphs.oracle import SUM_BLOCK

# Top-p searches its cutoff among the TopK(min(V, K)) largest logits for each K in turn, and sorts the
# whole vocabulary only when their mass falls short of top_p. On 2 cores, for 5 rows of 151,936 logits:
# TopK(1024) ~2.4 ms, TopK(8192) ~8.5 ms, a full sort ~64 ms.
TOP_P_TIERS = (1024, 8192)


def exp32(b: GraphBuilder, x: Value) -> Value:
    """exp in fp64, rounded once to fp32 (oracle.exp32)."""
    return b.op("Cast", b.op("Exp", b.op("Cast", x, to=DOUBLE)), to=FLOAT)


def vocab_size(b: GraphBuilder, x: Value, vocab: int | None) -> Value:
    """V as int64 [1]: a constant when known, else x.shape[-1]."""
    return b.const([vocab]) if vocab is not None else b.op("Shape", x, start=-1)


def _blocks(b: GraphBuilder, x: Value, vocab: int | None, shape: Sequence[int]) -> Value:
    """[N, V] -> `shape` (with SUM_BLOCK in it), zeros appended up to a multiple of SUM_BLOCK (+0 is exact)."""
    if vocab is None or vocab % SUM_BLOCK:
        pad = b.op("Mod", b.op("Neg", vocab_size(b, x, vocab)), b.const([SUM_BLOCK]))  # [1] (-V) mod B
        x = b.op("Pad", x, b.op("Concat", b.const([0, 0, 0]), pad, axis=0))
    return b.op("Reshape", x, b.const(shape))


def fsum(b: GraphBuilder, x: Value, vocab: int | None) -> Value:
    """oracle.fsum: [N, V] -> [N, 1].

        x [N,V] --pad, reshape--> [N,A,B] --CumSum(axis 1), last--> column sums [N,1,B]
                --CumSum(axis -1), last--> [N,1,1] --squeeze--> [N,1]
    """
    blocks = _blocks(b, x, vocab, [0, -1, SUM_BLOCK])  # [N, A, B]
    columns = b.slice(b.op("CumSum", blocks, b.const(1)), -1, INT64_MAX, axis=1)  # [N, 1, B]
    total = b.slice(b.op("CumSum", columns, b.const(-1)), -1, INT64_MAX, axis=-1)  # [N, 1, 1]
    return b.op("Squeeze", total, b.const([2]))  # [N, 1]


def fcdf(b: GraphBuilder, dist: Value, vocab: int | None) -> tuple[Value, Value]:
    """oracle.fcdf of one row [1, V], left in block-transposed layout: -> cdf [B, A], total [1, 1].

    Entry (b, a) is token a*B + b (pads past V hold the total). Counting entries needs no other order.

        dist [1,V] --pad, reshape [A,B], transpose--> [B,A] --CumSum(axis 0)--> within [B,A]
        offsets = CumSum(within[-1:], axis 1, exclusive)                         [1,A]
        cdf = within + offsets                                                   [B,A]
    """
    blocks = b.op("Transpose", _blocks(b, dist, vocab, [-1, SUM_BLOCK]), perm=[1, 0])  # [B, A]
    within = b.op("CumSum", blocks, b.const(0))  # [B, A] prefix inside each block (column)
    totals = b.slice(within, -1, INT64_MAX, axis=0)  # [1, A]
    offsets = b.op("CumSum", totals, b.const(1), exclusive=1)  # [1, A] sum of the blocks before
    cdf = b.op("Add", within, offsets)  # [B, A]
    total = b.slice(b.slice(cdf, -1, INT64_MAX, axis=0), -1, INT64_MAX, axis=1)  # [1, 1]
    return cdf, total


def count(b: GraphBuilder, flags: Value, axis: int | None = None) -> Value:
    """Number of True entries: over everything -> int64 [1], or over `axis` (keepdims). Exact below 2^24."""
    ones = b.op("Cast", flags, to=FLOAT)
    total = b.op("ReduceSum", ones, keepdims=1) if axis is None else b.reduce("ReduceSum", ones, axis)
    total = b.op("Cast", total, to=INT64)
    return b.op("Reshape", total, b.const([1])) if axis is None else total


def draw(b: GraphBuilder, dist: Value, u: Value, vocab: int | None) -> Value:
    """Inverse-CDF draw (oracle.draw) from an unnormalised distribution [1, V] with u fp32 [1] -> int64 [1].

        cdf, total = fcdf(dist);  threshold = u * total
        token = min( count(cdf <= threshold),  count(cdf < total) )   # clamped to the last token with mass
    """
    cdf, total = fcdf(b, dist, vocab)  # [B, A], [1, 1]
    token = count(b, b.op("LessOrEqual", cdf, b.op("Mul", u, total)))  # [1]
    return b.op("Min", token, count(b, b.op("Less", cdf, total)))


def count_leading(b: GraphBuilder, flags: Value) -> Value:
    """Number of leading True values: bool [k] -> int64 [1] (0 for k = 0).

        flags [k] --Not, Cast--> rejected [k] --CumSum--> rejections so far [k] --(== 0), count--> [1]
    """
    rejected = b.op("Cast", b.op("Not", flags), to=FLOAT)  # [k] (a float CumSum: TensorRT's takes no int64)
    return count(b, b.op("Equal", b.op("CumSum", rejected, b.const(0)), b.const(0.0, np.float32)))


def sorted_top(b: GraphBuilder, x: Value, k: Value) -> tuple[Value, Value]:
    """The k largest logits of each row, descending, with their token ids: [N, V] -> [N, k], [N, k].

    An unsorted TopK, then a sort of the k survivors.
    """
    values, indices = b.op("TopK", x, k, axis=-1, largest=1, sorted=0, outputs=2)  # [N, k]
    values, order = b.op("TopK", values, k, axis=-1, largest=1, sorted=1, outputs=2)  # [N, k]
    return values, b.op("GatherElements", indices, order, axis=-1)


def top_p_cutoff(b: GraphBuilder, x: Value, e: Value, kth: Value, top_p: Value, first: tuple[Value, Value],
                 vocab: int | None) -> Value:
    """oracle.top_p_cutoff on the top-k distribution: the smallest logit top-p keeps, per row -> [N, 1].

    Exact without a full sort: the cumsum over a row's K largest logits is a prefix of the cumsum over
    its full descending order, so the cutoff lies among them whenever their mass reaches top_p (keeping
    every logit >= cutoff over the full vocabulary then keeps ties outside them too). When the last
    candidate has no mass (below the k-th logit, or exp underflow), neither has anything after it: the
    cutoff may then differ from the oracle's, but only among tokens without mass, so the distribution
    is the same. `first` is the first candidate list (sorted_top of x); the TOP_P_TIERS and V follow only
    while some row falls short.

        e_k = e * (x >= kth);  s = fsum(e_k)                                [N,V], [N,1]
        cum = CumSum(e_k[candidates] / s)                                   [N,K] inclusive
        If every row has cum[-1] >= top_p or no mass at its last candidate, or K == V:  (candidates, cum)
        else:  next tier: sorted_top(x, min(V, K')), ...                    until K' = V
        c = min(count(cum < top_p), K - 1);  cutoff = candidates[c]         [N,1]
    """
    e_k = b.op("Mul", e, b.op("Cast", b.op("GreaterOrEqual", x, kth), to=FLOAT))  # [N, V] top-k distribution
    s = fsum(b, e_k, vocab)  # [N, 1]
    v = vocab_size(b, x, vocab)  # [1]

    def tier(sub: GraphBuilder, values: Value, indices: Value, rest: Sequence[int]) -> list[Value]:
        probs = sub.op("Div", sub.op("GatherElements", e_k, indices, axis=-1), s)  # [N, K]
        cum = sub.op("CumSum", probs, sub.const(-1))  # [N, K]
        if not rest:  # the whole vocabulary
            return [values, cum]
        covered = sub.op("GreaterOrEqual", sub.slice(cum, -1, INT64_MAX, axis=-1), top_p)  # [N, 1]
        exhausted = sub.op("Equal", sub.slice(probs, -1, INT64_MAX, axis=-1), sub.const(0.0, np.float32))  # [N, 1]
        rows_done = sub.op("Cast", sub.op("Or", covered, exhausted), to=FLOAT)  # [N, 1]
        all_rows = sub.op("Equal", sub.op("ReduceMin", rows_done, keepdims=0), sub.const(1.0, np.float32))  # []
        whole = sub.op("GreaterOrEqual", sub.op("Shape", values, start=-1), v)  # [1]
        done = sub.op("Or", all_rows, whole)  # [1]

        def next_tier(sub2: GraphBuilder) -> list[Value]:
            if rest[0] == 0:  # the whole vocabulary: one sorted TopK
                values2, indices2 = sub2.op("TopK", x, v, axis=-1, largest=1, sorted=1, outputs=2)
            else:
                values2, indices2 = sorted_top(sub2, x, sub2.op("Min", v, sub2.const([rest[0]])))
            return tier(sub2, values2, indices2, rest[1:])

        return sub.if_(done, lambda _: [values, cum], next_tier, [FLOAT, FLOAT])

    sorted_x, cum = tier(b, *first, [*TOP_P_TIERS[1:], 0])  # 0: V
    below = count(b, b.op("Less", cum, top_p), axis=-1)  # [N, 1]
    last = b.op("Sub", b.op("Shape", cum, start=-1), b.const([1]))  # [1]
    return b.op("GatherElements", sorted_x, b.op("Min", below, last), axis=-1)  # [N, 1]


def keep_threshold(b: GraphBuilder, x: Value, e: Value, top_k: Value, top_p: Value, top_k_on: Value,
                   top_p_on: Value, vocab: int | None) -> Value:
    """The smallest logit kept by top-k and top-p together (one of them on), per row: [N, V] -> [N, 1].

        candidates = sorted_top(x, top-k on ? top_k + 1 : min(V, 1024))          [N,K]
        kth = top-k on ? candidates[:, top_k - 1] : -inf                         [N,1]
        If top-p on:  max(kth, top_p_cutoff(x, e, kth, candidates))              full sort only if short
        else:         kth

    With top-k on, the one candidate past the k-th (no mass unless tied with it) lets top-p stop there.
    """
    on = b.op("Cast", top_k_on, to=INT64)  # [1] 1 / 0
    first_tier = b.op("Min", vocab_size(b, x, vocab), b.const([TOP_P_TIERS[0]]))
    k = b.op("Add", b.op("Mul", on, b.op("Add", top_k, b.const([1]))),
             b.op("Mul", b.op("Sub", b.const([1]), on), first_tier))  # [1] on ? top_k + 1 : min(V, C)
    candidates = sorted_top(b, x, k)  # [N, k]
    kth_at = b.op("Mul", on, b.op("Sub", top_k, b.const([1])))  # [1] top_k - 1 (0 when off: unused)
    kth = b.slice(candidates[0], kth_at, b.op("Add", kth_at, b.const([1])), axis=-1)  # [N, 1]
    kth = b.op("Where", top_k_on, kth, b.const([[-np.inf]], np.float32))  # [N, 1]

    def with_top_p(sub: GraphBuilder) -> list[Value]:
        return [sub.op("Max", kth, top_p_cutoff(sub, x, e, kth, top_p, candidates, vocab))]

    return b.if_(top_p_on, with_top_p, lambda _: [kth], [FLOAT])[0]


Exp = Callable[[GraphBuilder, Value], Value]  # exp32, or sampling_trt's fp32 Exp
KeepThreshold = Callable[[GraphBuilder, Value, Value, Value, Value, Value, Value, int | None], Value]  # keep_threshold's


def transform(b: GraphBuilder, logits: Value, temperature: Value, top_k: Value, top_p: Value,
              vocab: int | None, exp: Exp = exp32, keep: KeepThreshold = keep_threshold) -> Value:
    """Sampling distribution (temperature > 0): fp32 logits [N, V] -> probs [N, V] (oracle.transform).

    `exp` and `keep` are the oracle-exact defaults; sampling_trt.py passes its TensorRT forms.

        x = logits / temperature                                        [N,V]
        e = exp32(x - max(x))                                           [N,V] unnormalised softmax
        If top-k on (0 < top_k < V) or top-p on (top_p < 1):
            e = e * (x >= keep_threshold(x, e))                         [N,V] top-k and top-p
        probs = e / fsum(e)                                             [N,V] (in each branch: no copy)
    """
    x = b.op("Div", logits, temperature)  # [N, V]
    e = exp(b, b.op("Sub", x, b.reduce("ReduceMax", x, axis=-1)))  # [N, V]
    top_k_on = b.op("And", b.op("Greater", top_k, b.const([0])), b.op("Less", top_k, vocab_size(b, x, vocab)))
    top_p_on = b.op("Less", top_p, b.const([1.0], np.float32))  # [1]

    def filtered(sub: GraphBuilder) -> list[Value]:
        threshold = keep(sub, x, e, top_k, top_p, top_k_on, top_p_on, vocab)  # [N, 1]
        kept = sub.op("Mul", e, sub.op("Cast", sub.op("GreaterOrEqual", x, threshold), to=FLOAT))  # [N, V]
        return [sub.op("Div", kept, fsum(sub, kept, vocab))]

    def unfiltered(sub: GraphBuilder) -> list[Value]:
        return [sub.op("Div", e, fsum(sub, e, vocab))]

    return b.if_(b.op("Or", top_k_on, top_p_on), filtered, unfiltered, [FLOAT])[0]
