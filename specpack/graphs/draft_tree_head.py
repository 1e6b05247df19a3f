"""The draft step's head in the draft's tree form (docs/trees.md, "Trees drafted by the draft model"): the draft head of
graphs/heads.py on the last row, plus each own row's top-K under the draft's log-softmax (temperature 1), what a token
tree's expansion reads.

The plain graph's tree form (export/torch_export.py, draft_tree) takes draft_positions [1, W] and draft_mask [1, W, M]
for its last W rows (own rows: nodes being expanded); this head shares draft_positions (for W) and reads the last
R = max(W, 1) rows, so the lm_head computes only those (attach.py slices its input, as for a chain's one row):

    logits [1, R, V] ─┬─ last row ─> add_draft_head (heads.py) ─────────────────> token [1], probs [1, V]
                      └─ Cast fp32 ─> LogSoftmax ─> TopK(K) ─> values, index     [1, R, K] each, best first
                                       Concat(rows [0, W), row R - 1) ─────────> tree_logprobs, tree_tokens [1, W + 1, K]

The last row's top-K is repeated after the own rows, as a draft head's tree form gives them (export/head_export.py),
so a catch-up (W = 0) gives the root's children and an expansion its own rows'. TopK breaks ties by the lower index.
"""

from __future__ import annotations

from functools import partial

from specpack import names
from specpack.graphs import sampling_graph as sg
from specpack.graphs.heads import AddHead, HeadIO, Transform, add_draft_head, draft_head_io, last_rows
from specpack.graphs.onnx_builder import FLOAT, INT64, INT64_MAX, GraphBuilder, Value, tensor_info


def _own_rows(b: GraphBuilder) -> Value:
    return b.op("Shape", names.DRAFT_POSITIONS, start=1, end=2)  # W, int64 [1]


def _rows(b: GraphBuilder) -> Value:
    return b.op("Max", _own_rows(b), b.const([1]))  # R = max(W, 1)


def draft_tree_head_io(vocab: int | str, width: int) -> HeadIO:
    """The draft head's I/O plus draft_positions (shared with the plain graph) and the top-K outputs."""
    chain = draft_head_io(vocab)
    rows = "own_rows_plus_1"
    return HeadIO(inputs=[tensor_info(names.DRAFT_POSITIONS, INT64, [1, "own_rows"]), *chain.inputs],
                  outputs=[*chain.outputs, tensor_info(names.TREE_TOKENS, INT64, [1, rows, width]),
                           tensor_info(names.TREE_LOGPROBS, FLOAT, [1, rows, width])],
                  rows=_rows)


def add_draft_tree_head(b: GraphBuilder, logits: Value, logits_type: int = FLOAT, vocab: int | None = None,
                        width: int = 1, transform: Transform = sg.transform) -> None:
    """logits [1, R, V] (the last R = max(W, 1) rows): token and probs from the last row (add_draft_head), and the top
    `width` tokens and log-probabilities of rows [0, W) and of the last row (module docstring)."""
    add_draft_head(b, last_rows(b, logits, b.const([1])), logits_type, vocab, transform)
    x = logits if logits_type == FLOAT else b.op("Cast", logits, to=FLOAT)  # [1, R, V] fp32
    values, index = b.op("TopK", b.op("LogSoftmax", x, axis=-1), b.const([width]), axis=-1, largest=1, sorted=1,
                         outputs=2)  # [1, R, K] each
    w = _own_rows(b)
    for value, name in ((index, names.TREE_TOKENS), (values, names.TREE_LOGPROBS)):
        own, last = b.slice(value, 0, w, axis=1), b.slice(value, -1, INT64_MAX, axis=1)  # [1, W, K], [1, 1, K]
        b.op("Concat", own, last, axis=1)
        b.nodes[-1].output[0] = name  # the graph output's contract name


def draft_tree_head(width: int, transform: Transform = sg.transform) -> AddHead:
    """add_draft_tree_head with its TopK's K (and the sampling transform's form) fixed: what attach.py takes."""
    return partial(add_draft_tree_head, width=width, transform=transform)
