"""The batched verify head (docs/batching.md, "The batched graph form"): every row of a padded batch verifies its own
chain, with its own draft count, sampling inputs and uniforms. Its oracle is graphs/batch_oracle.py.

Each row runs the batch-1 head's chain rule (heads.verify_chain, sampling_graph's transform and draw) on its own
unpadded rows, in a `Scan` over the batch: one way to verify a chain, so the batched head is bit-exact with the batch-1
head (and the oracle) row by row, and a pad position is never read.

    inputs   input_ids [B, S] (the graph's), draft_counts k_b [B], token_counts S_b [B] (row b's real new tokens: its
             first S_b of S), draft_probs [B, K, V] (row b's first k_b used), uniforms [B, K+1] (first k_b + 1 used),
             temperature / top_k / top_p [B]
    select   row b reads positions S_b - k_b - 1 .. S_b - 1 (the last committed token, then its drafts): gathered as
             [B, K+1] positions pos[b, i] = min(S_b - k_b - 1 + i, S - 1), so the lm_head computes K + 1 rows per
             batch row (attach.py prunes it with this selection); drafts[b, j] = input_ids[b, pos[b, j + 1]]
    per row  x = logits[b, :k_b+1], drafts[b, :k_b], q = draft_probs[b, :k_b], u = uniforms[b, :k_b+1]
             -> verify_chain -> n_accepted[b], next_token[b]
"""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx
from onnx import helper

from specpack import names
from specpack.graphs import sampling_graph as sg
from specpack.graphs.heads import ChainSampling, Dim, HeadIO, Transform, verify_chain
from specpack.graphs.onnx_builder import FLOAT, INT64, GraphBuilder, Value, tensor_info


def _num_drafts(b: GraphBuilder) -> Value:
    return b.op("Shape", names.DRAFT_PROBS, start=1, end=2)  # K, int64 [1]


def _rows(b: GraphBuilder) -> Value:
    return b.op("Add", _num_drafts(b), b.const([1]))  # K + 1


def row_counts(b: GraphBuilder) -> Value:
    """k_b [B]: the drafts each row verifies (tests/mutations.py replaces it to show the chi-square tests catch a
    head that ignores it)."""
    return names.DRAFT_COUNTS


def positions(b: GraphBuilder, rows_k1: Value | None = None) -> Value:
    """pos [B, K+1]: pos[b, i] = min(S_b - k_b - 1 + i, S_b - 1), the positions row b's verify reads (docstring);
    rows_k1: K + 1 as int64 [1] (default: from draft_probs' shape)."""
    rows = b.op("Squeeze", _rows(b) if rows_k1 is None else rows_k1, b.const([0]))  # [] K + 1
    steps = b.op("Range", b.const(0), rows, b.const(1))  # [K+1]
    start = b.op("Sub", b.op("Sub", names.TOKEN_COUNTS, row_counts(b)), b.const([1]))  # [B] S_b - k_b - 1 (>= 0)
    pos = b.op("Add", b.op("Unsqueeze", start, b.const([1])), steps)  # [B, K+1]
    # [B, K+1]: pads (i > k_b) clamped to the row's own last token (never read). The bound is S_b - 1 from the
    # token_counts input, a device tensor, never S - 1 from input_ids' shape: a shape is a host value, and the CUDA EP
    # copies a host value into a device op (a Memcpy node, which CUDA graph capture refuses; a Clip's bounds too: an
    # H100, 2026-12-07, onnxruntime-gpu 1.31.1)
    last = b.op("Unsqueeze", b.op("Sub", names.TOKEN_COUNTS, b.const([1])), b.const([1]))  # [B, 1] S_b - 1
    return b.op("Min", pos, last)


def gather_rows(b: GraphBuilder, x: Value, pos: Value) -> Value:
    """x [B, S, ...] at pos [B, R] -> [B, R, ...]."""
    return b.op("GatherND", x, b.op("Unsqueeze", pos, b.const([-1])), batch_dims=1)


def select(b: GraphBuilder, x: Value) -> Value:
    """HeadIO.select: the K + 1 positions of each row (`positions`)."""
    return gather_rows(b, x, positions(b))


def batched_verify_head_io(vocab: Dim) -> HeadIO:
    """+ draft_counts, token_counts, draft_probs, uniforms, per-row sampling inputs -> n_accepted, next_token [B]."""
    batch = "batch_size"
    return HeadIO(inputs=[tensor_info(names.DRAFT_COUNTS, INT64, [batch]), tensor_info(names.TOKEN_COUNTS, INT64, [batch]),
                          tensor_info(names.DRAFT_PROBS, FLOAT, [batch, "k", vocab]),
                          tensor_info(names.UNIFORMS, FLOAT, [batch, "k_plus_1"]),
                          tensor_info(names.TEMPERATURE, FLOAT, [batch]), tensor_info(names.TOP_K, INT64, [batch]),
                          tensor_info(names.TOP_P, FLOAT, [batch])],
                  outputs=[tensor_info(names.N_ACCEPTED, INT64, [batch]), tensor_info(names.NEXT_TOKEN, INT64, [batch])],
                  rows=_rows, select=select)


def _greedy_rows(b: GraphBuilder) -> Value:
    return b.op("Add", b.op("ReduceMax", row_counts(b), keepdims=1), b.const([1]))  # [1] K + 1, K = max k_b


def batched_greedy_head_io() -> HeadIO:
    """The batched greedy head: + draft_counts k_b, token_counts S_b [B] -> best int64 [B, K+1] (K = max k_b), the
    argmax at the verify head's positions (`positions`): best[b, :k_b + 1] after row b's last committed token and after
    each draft (a verify), best[b, 0] after its last fed token when k_b = 0 (a draft step: runtime/batched_draft.py);
    the rest of a row is clamped, never read. So the lm_head computes K + 1 rows per batch row, not S (a prompt's
    catch-up of 150 tokens: 150 rows of 2 * H * V flops each, all but one thrown away)."""
    batch = "batch_size"
    return HeadIO(inputs=[tensor_info(names.DRAFT_COUNTS, INT64, [batch]), tensor_info(names.TOKEN_COUNTS, INT64, [batch])],
                  outputs=[tensor_info(names.BEST, INT64, [batch, "k_plus_1"])], rows=_greedy_rows,
                  select=lambda b, x: gather_rows(b, x, positions(b, _greedy_rows(b))))


def add_batched_greedy_head(b: GraphBuilder, logits: Value, logits_type: int = FLOAT, vocab: int | None = None) -> None:
    """best = ArgMax(logits) over the vocabulary: [B, K+1, V] -> [B, K+1]."""
    b.nodes.append(helper.make_node("ArgMax", [logits], [names.BEST], name=b.fresh("ArgMax"), axis=-1, keepdims=0))


def add_batched_verify_head(b: GraphBuilder, logits: Value, logits_type: int = FLOAT, vocab: int | None = None,
                            transform: Transform = sg.transform) -> None:
    """`logits` [B, K+1, V]: the selected positions (`select`) -> n_accepted [B], next_token [B] (module docstring)."""
    x = logits if logits_type == FLOAT else b.op("Cast", logits, to=FLOAT)  # [B, K+1, V]
    pos = positions(b)  # [B, K+1]
    drafts = gather_rows(b, names.INPUT_IDS, b.slice(pos, 1, np.iinfo(np.int64).max, axis=1))  # [B, K]

    def row(sub: GraphBuilder, v: list[Value]) -> list[Value]:
        x_b, drafts_b, q_b, u_b, count, temperature, top_k, top_p = v
        k = sub.op("Unsqueeze", count, sub.const([0]))  # [1] k_b
        k1 = sub.op("Add", k, sub.const([1]))  # [1]
        one = partial(sub.op, "Unsqueeze")
        sampling = ChainSampling(one(temperature, sub.const([0])), one(top_k, sub.const([0])),
                                 one(top_p, sub.const([0])))
        return verify_chain(sub, sub.slice(x_b, 0, k1, axis=0), sub.slice(drafts_b, 0, k, axis=0),
                            sub.slice(q_b, 0, k, axis=0), sub.slice(u_b, 0, k1, axis=0), k, sampling, vocab, transform)

    n, token = b.scan([x, drafts, names.DRAFT_PROBS, names.UNIFORMS, row_counts(b), names.TEMPERATURE,
                       names.TOP_K, names.TOP_P], row,
                      [FLOAT, INT64, FLOAT, FLOAT, INT64, FLOAT, INT64, FLOAT], [INT64, INT64])  # [B, 1] each
    for value, name in ((n, names.N_ACCEPTED), (token, names.NEXT_TOKEN)):
        b.nodes.append(helper.make_node("Squeeze", [value, b.const([1])], [name], name=b.fresh("Squeeze")))


def batched_verify_head_model(opset: int = 18, vocab: int | None = None,
                              transform: Transform = sg.transform) -> onnx.ModelProto:
    """The batched verify head alone, for tests: logits [B, S, V] fp32, input_ids [B, S] + the head's inputs."""
    b = GraphBuilder(opset)
    add_batched_verify_head(b, select(b, names.LOGITS), FLOAT, vocab, transform)
    io = batched_verify_head_io(vocab or "V")
    inputs = [tensor_info(names.LOGITS, FLOAT, ["batch_size", "S", vocab or "V"]),
              tensor_info(names.INPUT_IDS, INT64, ["batch_size", "S"]), *io.inputs]
    graph = helper.make_graph(b.nodes, "batched_head", inputs, io.outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="specpack")
    model.ir_version = min(model.ir_version, 10)
    onnx.checker.check_model(model)
    return model
