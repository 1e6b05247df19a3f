"""The draft-step and verify heads: logits in, a few integers (and q) out. The graph form of oracle.py.

A head reads only the last positions of the forward pass: `HeadIO.rows` says how many (draft: 1, verify:
k + 1), and `add_draft_head` / `add_verify_head` take logits of exactly those rows, [1, rows, V]. Choosing
the rows is one step, `last_rows`, done once and as early as possible: attach.py slices the hidden states
before the lm_head (prune_logits.py), so the target never computes logits it throws away;
`draft_head_model` / `verify_head_model` (a head alone, `logits` [1, S, V] as a graph input, for tests
and benchmarks) slice their logits input. Greedy (temperature 0) is an `If` branch that does no sampling
work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import onnx
from onnx import TensorProto, helper

from specpack import names
from specpack.graphs import sampling_graph as sg
from specpack.graphs.onnx_builder import FLOAT, INT64, INT64_MAX, GraphBuilder, Value, tensor_info

Dim = int | str
AddHead = Callable[[GraphBuilder, Value, int, int | None], None]  # (builder, logits [1,rows,V], dtype, V)
Rows = Callable[[GraphBuilder], Value]  # -> int64 [1]: how many last positions of the forward pass a head reads
# (builder, fp32 logits [N, V], temperature, top_k, top_p, V) -> probs [N, V]: sg.transform, or sampling_trt.transform
Transform = Callable[[GraphBuilder, Value, Value, Value, Value, int | None], Value]
Select = Callable[[GraphBuilder, Value], Value]  # [B, S, ...] -> the positions a head reads, [B, R, ...]


@dataclass(frozen=True)
class HeadIO:
    """A head's extra graph inputs, its outputs (as ValueInfos), and the number of last positions it reads (or, with
    `select`, which positions of each batch row: the batched verify head's, graphs/batched_head.py)."""

    inputs: list[onnx.ValueInfoProto]
    outputs: list[onnx.ValueInfoProto]
    rows: Rows
    select: Select | None = None

    def positions(self, b: GraphBuilder, x: Value) -> Value:
        """The positions of x [B, S, ...] the head reads: `select`, or the last `rows`."""
        return self.select(b, x) if self.select is not None else last_rows(b, x, self.rows(b))


def last_rows(b: GraphBuilder, x: Value, rows: Value) -> Value:
    """x[:, -rows:] along axis 1 (positions) of a [B, S, ...] value; all of x when S <= rows."""
    return b.slice(x, b.op("Neg", rows), INT64_MAX, axis=1)


def _draft_rows(b: GraphBuilder) -> Value:
    return b.const([1])


def _verify_rows(b: GraphBuilder) -> Value:
    return b.op("Add", _num_drafts(b), b.const([1]))  # k + 1


def _num_drafts(b: GraphBuilder) -> Value:
    return b.op("Shape", names.DRAFT_PROBS, start=1, end=2)  # k, int64 [1]


def _sampling_inputs() -> list[onnx.ValueInfoProto]:
    return [tensor_info(names.TEMPERATURE, FLOAT, [1]), tensor_info(names.TOP_K, INT64, [1]),
            tensor_info(names.TOP_P, FLOAT, [1])]


def draft_head_io(vocab: Dim) -> HeadIO:
    """Draft head: + uniform, temperature, top_k, top_p -> token int64 [1], probs fp32 [1, V]."""
    return HeadIO(inputs=[tensor_info(names.UNIFORM, FLOAT, [1]), *_sampling_inputs()],
                  outputs=[tensor_info(names.TOKEN, INT64, [1]), tensor_info(names.PROBS, FLOAT, [1, vocab])],
                  rows=_draft_rows)


def verify_head_io(vocab: Dim) -> HeadIO:
    """Verify head: + draft_probs, uniforms, sampling inputs -> n_accepted int64 [1], next_token int64 [1]."""
    return HeadIO(inputs=[tensor_info(names.DRAFT_PROBS, FLOAT, [1, "k", vocab]),
                          tensor_info(names.UNIFORMS, FLOAT, [1, "k_plus_1"]), *_sampling_inputs()],
                  outputs=[tensor_info(names.N_ACCEPTED, INT64, [1]), tensor_info(names.NEXT_TOKEN, INT64, [1])],
                  rows=_verify_rows)


def add_draft_head(b: GraphBuilder, logits: Value, logits_type: int = FLOAT, vocab: int | None = None,
                   transform: Transform = sg.transform) -> None:
    """Draw the draft token from `logits` [1, 1, V] (fp32, fp16 or bf16): the last position (`last_rows`).

    `vocab`: V when the graph is built for one vocabulary, None for any (taken from shapes). `transform`: the
    sampling transform's form (sampling_graph.py: oracle-exact; sampling_trt.py: TensorRT's ops).

        x = Cast(logits[0], fp32)                                      [1,V]
        If temperature == 0:  token = ArgMax(x)                        [1]
                              probs = OneHot(token, V)                 [1,V]
        else:                 probs = transform(x)                     [1,V] q
                              token = draw(probs, uniform)             [1]
        -> token, probs
    """
    x = _fp32(b, b.op("Squeeze", logits, b.const([1])), logits_type)  # [1, V]; Squeeze fails unless 1 row

    def greedy(sub: GraphBuilder) -> list[Value]:
        token = sub.op("ArgMax", x, axis=-1, keepdims=0)  # [1]
        probs = sub.op("OneHot", token, sg.vocab_size(sub, x, vocab), sub.const([0.0, 1.0], np.float32), axis=-1)
        return [token, probs]

    def sample(sub: GraphBuilder) -> list[Value]:
        probs = transform(sub, x, names.TEMPERATURE, names.TOP_K, names.TOP_P, vocab)  # [1, V]
        return [sg.draw(sub, probs, names.UNIFORM, vocab), probs]

    b.if_(_is_greedy(b), greedy, sample, [INT64, FLOAT], out_names=[names.TOKEN, names.PROBS])


def add_verify_head(b: GraphBuilder, logits: Value, logits_type: int = FLOAT, vocab: int | None = None,
                    transform: Transform = sg.transform) -> None:
    """Accept a prefix of the k draft tokens (the last k of input_ids) and pick the next token.

    `logits` [1, k+1, V]: the last k + 1 positions (`last_rows`), k = draft_probs.shape[1]; `transform` as in
    add_draft_head.

        x = Cast(logits[0], fp32)                                                [k+1,V]
        drafts = input_ids[0, S-k:]                                              [k]
        If temperature == 0:  best = ArgMax(x)                                   [k+1]
                              n = leading(drafts == best[:k]);  next = best[n]
        else:                 p = transform(x);  q = draft_probs[0]              [k+1,V], [k,V]
                              n = leading(u[:k] * q(drafts) < p[:k](drafts))     ratio test, no division
                              residual = max(0, p[n] - [q; 0][n])                [1,V] (n = k: p[k], bonus)
                              residual += p[n] if max(residual) == 0             fp-rounding fallback
                              next = draw(residual, u[k])
        -> n_accepted, next_token
    """
    k = _num_drafts(b)  # [1]
    x = _fp32(b, b.op("Squeeze", logits, b.const([0])), logits_type)  # [k+1, V]
    seq_len = b.op("Shape", names.INPUT_IDS, start=1, end=2)  # [1]
    drafts = b.slice(names.INPUT_IDS, b.op("Sub", seq_len, k), INT64_MAX, axis=1)  # [1, k]
    drafts = b.op("Squeeze", drafts, b.const([0]))  # [k]
    q = b.op("Squeeze", names.DRAFT_PROBS, b.const([0]))  # [k, V] draft
    u = b.op("Squeeze", names.UNIFORMS, b.const([0]))  # [k+1]
    sampling = ChainSampling(names.TEMPERATURE, names.TOP_K, names.TOP_P)
    verify_chain(b, x, drafts, q, u, k, sampling, vocab, transform, out_names=[names.N_ACCEPTED, names.NEXT_TOKEN])


@dataclass(frozen=True)
class ChainSampling:
    """One request's sampling inputs as graph values: temperature fp32 [1], top_k int64 [1], top_p fp32 [1]."""

    temperature: Value
    top_k: Value
    top_p: Value


def verify_chain(b: GraphBuilder, x: Value, drafts: Value, q: Value, u: Value, k: Value, sampling: ChainSampling,
                 vocab: int | None, transform: Transform, out_names: list[str] | None = None) -> list[Value]:
    """One chain's acceptance (sketch in add_verify_head): fp32 logits x [k+1, V], drafts [k], q [k, V], u [k+1],
    k int64 [1] -> n_accepted [1], next_token [1]. The batch-1 head and each row of the batched one
    (batched_head.py) run this."""

    def greedy(sub: GraphBuilder) -> list[Value]:
        best = sub.op("ArgMax", x, axis=-1, keepdims=0)  # [k+1]
        n = sg.count_leading(sub, sub.op("Equal", drafts, sub.slice(best, 0, k, axis=0)))  # [1]
        return [n, sub.op("Gather", best, n, axis=0)]

    def sample(sub: GraphBuilder) -> list[Value]:
        return list(_rejection_sample(sub, x, drafts, q, u, k, sampling, vocab, transform))

    greedy_row = b.op("Equal", sampling.temperature, b.const([0.0], np.float32))  # [1] bool
    return b.if_(greedy_row, greedy, sample, [INT64, INT64], out_names=out_names)


def _rejection_sample(b: GraphBuilder, x: Value, drafts: Value, q: Value, u: Value, k: Value, sampling: ChainSampling,
                      vocab: int | None, transform: Transform) -> tuple[Value, Value]:
    """The sampling branch of the verify head (sketch in add_verify_head): -> n [1], next token [1]."""
    p = transform(b, x, sampling.temperature, sampling.top_k, sampling.top_p, vocab)  # [k+1, V] target
    index = b.op("Unsqueeze", drafts, b.const([1]))  # [k, 1]
    p_x = b.op("GatherElements", p, index, axis=1)  # [k, 1] p_i(x_i): rows 0..k-1 of p
    q_x = b.op("GatherElements", q, index, axis=1)  # [k, 1] q_i(x_i) > 0
    # accept x_i iff u_i < p_i(x_i) / q_i(x_i)  <=>  u_i * q_i(x_i) < p_i(x_i)
    lhs = b.op("Mul", b.slice(u, 0, k, axis=0), b.op("Squeeze", q_x, b.const([1])))  # [k]
    n = sg.count_leading(b, b.op("Less", lhs, b.op("Squeeze", p_x, b.const([1]))))  # [1]
    # q padded with a zero row: n == k gives max(0, p_k - 0) = p_k, the bonus distribution.
    zeros = b.op("ConstantOfShape", b.op("Concat", b.const([1]), sg.vocab_size(b, p, vocab), axis=0))  # [1, V]
    q_ext = b.op("Concat", q, zeros, axis=0)  # [k+1, V]
    p_n = b.op("Gather", p, n, axis=0)  # [1, V]
    residual = b.op("Relu", b.op("Sub", p_n, b.op("Gather", q_ext, n, axis=0)))  # [1, V] max(0, p_n - q_n)
    # No residual mass (p_n == q_n up to fp rounding): fall back to p_n. residual + 0 * p_n is exact.
    empty = b.op("Cast", b.op("Equal", b.reduce("ReduceMax", residual, axis=-1), b.const(0.0, np.float32)), to=FLOAT)
    dist = b.op("Add", residual, b.op("Mul", empty, p_n))  # [1, V]
    return n, sg.draw(b, dist, b.slice(u, k, INT64_MAX, axis=0), vocab)  # u_k [1]


def _fp32(b: GraphBuilder, x: Value, logits_type: int) -> Value:
    return x if logits_type == FLOAT else b.op("Cast", x, to=FLOAT)


def _is_greedy(b: GraphBuilder) -> Value:
    return b.op("Equal", names.TEMPERATURE, b.const([0.0], np.float32))  # [1] bool


def head_model(add_head: AddHead, io: HeadIO, logits_type: int, opset: int, vocab: int | None,
               extra: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
    """A head alone, for tests and benchmarks: logits [1, S, V] (it reads the last io.rows), `extra` inputs (before the
    head's own) -> the head's outputs."""
    b = GraphBuilder(opset)
    add_head(b, last_rows(b, names.LOGITS, io.rows(b)), logits_type, vocab)
    logits = tensor_info(names.LOGITS, logits_type, [1, "S", vocab or "V"])
    graph = helper.make_graph(b.nodes, "head", [logits, *extra, *io.inputs], io.outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="specpack")
    model.ir_version = min(model.ir_version, 10)  # what onnxruntime >= 1.20 reads
    onnx.checker.check_model(model)
    return model


def draft_head_model(opset: int = 18, logits_type: int = TensorProto.FLOAT, vocab: int | None = None,
                     transform: Transform = sg.transform) -> onnx.ModelProto:
    """The draft head alone: logits [1, S, V] (reads the last row) + draft head inputs -> token, probs. vocab None: any V."""
    return head_model(partial(add_draft_head, transform=transform), draft_head_io(vocab or "V"), logits_type, opset,
                       vocab, [])


def verify_head_model(opset: int = 18, logits_type: int = TensorProto.FLOAT, vocab: int | None = None,
                      transform: Transform = sg.transform) -> onnx.ModelProto:
    """The verify head alone: logits [1, S, V] (reads the last k+1 rows), input_ids [1, S] + verify head inputs
    -> n_accepted, next_token."""
    input_ids = tensor_info(names.INPUT_IDS, INT64, [1, "S"])
    return head_model(partial(add_verify_head, transform=transform), verify_head_io(vocab or "V"), logits_type,
                       opset, vocab, [input_ids])
