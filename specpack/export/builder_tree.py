"""The tree form of a model builder graph (`spec-export --graphs builder --max-tree-nodes T`): plain -> tree form; and
the draft's tree form of a tree pack's builder draft (`add_draft_tree_form`, `draft_tree_inputs`, below).

    builder graph (renamed to our contract)  --+ parents [1, T] int64 in (dim tree_nodes), after attention_mask
    every GroupQueryAttention node (do_rotary 1: the rotary inside) gains
        input 9   position_ids    int64 [1, S]          rows before the nodes: L + s; node i: the root's + depth(i)
        input 10  attention_bias  io dtype [1, 1, S, M]  0 where tree_allowed, the dtype's lowest elsewhere

The torch tree form's contract (torch_export.py, docs/trees.md), so the tree verify head (attach.py), kv_compact.onnx
and the runtime serve both; one difference: the builder's positions stay internal (no position_ids input), the
graph takes them from the static mask as its GroupQueryAttention does. The same math as export/static_attention.py's
`tree_allowed` / `tree_positions`, on graphs/tree_head.py's ancestor mask and depths, computed once for all layers:

    end = ReduceSum(attention_mask)   [1] L + S;   first = end - T   the first node's cache row
    positions = L + [0 .. S-T-1] ++ (L + S-T-1 + depth)                                        [1, S]
    a[c]  = c - first if first <= c < first + T else T                                         [M] node of row c
    ext   = [[1 (S-T rows, T+1 cols)], [A | 1]]                                                [S, T+1]
    bias  = ext[:, a] ? 0 : lowest                                                             [1, 1, S, M]

A node row reads the rows before the nodes and its ancestors' rows (itself included); GroupQueryAttention's causal
mask does the rest (the tree mask is a subset of causal in topological order), so a chain (parents -1, 0, 1, ..)
and T = 0 (a prefill, a k = 0 step) get a zero bias and their own positions: the plain graph's run. Shape values
(S, T, M) enter the data only through Ranges over them (GraphBuilder.shape_value): no host copy on the CUDA EP.

GroupQueryAttention's position_ids: on its "first prompt" (sequence length == total_sequence_length, here M: a run
that fills the whole cache from row 0) the kernel reads only position_ids[0] and counts on from it; a tree never runs
there (a tree step follows a prefill), and a T = 0 run's positions count on from 0 anyway (tests/export/
test_builder_tree.py runs one).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from specpack import names
from specpack.errors import SpecpackError
from specpack.graphs.onnx_builder import INT64, GraphBuilder, Value
from specpack.graphs.tree_head import ancestor_mask, depths

TREE = "tree_nodes"  # dim_param of `parents` (torch_export.py's)
OWN, MAX = "own_rows", "max_sequence_length"  # dim_params of draft_positions / draft_mask (torch_export.py's)
GQA = "GroupQueryAttention"
POSITION_IDS_SLOT, ATTENTION_BIAS_SLOT = 9, 10  # com.microsoft GroupQueryAttention's optional inputs


def add_tree_form(plain: Path, max_nodes: int, context_length: int) -> None:
    """Rewrite the builder graph at `plain` (weights stay in its data file) into the tree form for trees of up to
    `max_nodes` nodes; `context_length`: the model's positions (a sliding window at least that long never binds)."""
    _feed_attention(plain, context_length, "specpack/tree/", lambda b, dtype: tree_inputs(b, max_nodes, dtype),
                    [onnx.helper.make_tensor_value_info(names.PARENTS, INT64, [1, TREE])])


def add_draft_tree_form(plain: Path, context_length: int) -> None:
    """Rewrite the builder graph of a tree pack's draft model at `plain` into the draft's tree form (torch_export.py's
    draft_tree contract: draft_positions [1, W] and draft_mask [1, W, M] in, after attention_mask; docs/trees.md,
    "Trees drafted by the draft model"): every GroupQueryAttention fed draft_tree_inputs."""
    _feed_attention(plain, context_length, "specpack/draft_tree/", draft_tree_inputs,
                    [onnx.helper.make_tensor_value_info(names.DRAFT_POSITIONS, INT64, [1, OWN]),
                     onnx.helper.make_tensor_value_info(names.DRAFT_MASK, onnx.TensorProto.BOOL, [1, OWN, MAX])])


def _feed_attention(plain: Path, context_length: int, prefix: str,
                    inputs: Callable[[GraphBuilder, int], tuple[Value, Value]],
                    new_inputs: list[onnx.ValueInfoProto]) -> None:
    """Every GroupQueryAttention of the graph at `plain` fed the (position_ids, attention_bias) that `inputs` builds
    (once, first in the graph), and `new_inputs` added after attention_mask; saved in place."""
    model = onnx.load(str(plain), load_external_data=False)
    graph = model.graph
    attention = [n for n in graph.node if n.op_type == GQA]
    _check_attention(plain, attention, context_length)
    past = next(i for i in graph.input if i.name.startswith("past_key_values."))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    b = GraphBuilder(opset, prefix=prefix)
    positions, bias = inputs(b, past.type.tensor_type.elem_type)
    for node in attention:
        slots = list(node.input) + [""] * max(0, ATTENTION_BIAS_SLOT + 1 - len(node.input))
        slots[POSITION_IDS_SLOT], slots[ATTENTION_BIAS_SLOT] = positions, bias
        node.input[:] = slots
    for offset, node in enumerate(b.nodes):  # first: they read graph inputs only
        graph.node.insert(offset, node)
    after_mask = next(i for i, v in enumerate(graph.input) if v.name == names.ATTENTION_MASK) + 1
    for offset, value in enumerate(new_inputs):
        graph.input.insert(after_mask + offset, value)
    onnx.save_model(model, str(plain))


def draft_tree_inputs(b: GraphBuilder, dtype: int) -> tuple[Value, Value]:
    """(position_ids int64 [1, S], attention_bias `dtype` [1, 1, S, M]) of the draft's tree form, from input_ids,
    attention_mask, draft_positions and draft_mask: the rows before the last W (own rows) at L + s, reading every row
    (the causal mask does the rest); own row j at draft_positions[j], reading what draft_mask[j] allows.

        positions = L + [0 .. S-W-1] ++ draft_positions                                    [1, S]
        bias      = [[1 (S-W rows, M cols)], [draft_mask]] ? 0 : lowest                      [1, 1, S, M]
    """
    zero = b.const([0])
    seq = b.op("Shape", names.INPUT_IDS, start=1, end=2)  # [1] S (host)
    own = b.op("Shape", names.DRAFT_POSITIONS, start=1, end=2)  # [1] W (host)
    max_len = b.op("Shape", names.ATTENTION_MASK, start=1, end=2)  # [1] M (host)
    before = b.op("Sub", seq, own)  # [1] S - W, the rows before the own rows (host)
    end = b.reduce("ReduceSum", names.ATTENTION_MASK, axis=1, keepdims=False)  # [1] L + S (device)
    start = b.op("Sub", end, b.shape_value(seq))  # [1] L
    rows = b.op("Add", _range(b, before), start)  # [S-W] L + s
    positions = b.op("Unsqueeze", b.op("Concat", rows, b.op("Squeeze", names.DRAFT_POSITIONS, zero), axis=0), zero)
    true = onnx.numpy_helper.from_array(np.ones(1, np.bool_))
    causal = b.op("ConstantOfShape", b.op("Concat", before, max_len, axis=0), value=true)  # [S-W, M]
    allowed = b.op("Concat", causal, b.op("Squeeze", names.DRAFT_MASK, zero), axis=0)  # [S, M] bool
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    zero_bias, lowest = b.const(0, np_dtype), b.const(np.finfo(np_dtype).min, np_dtype)  # scalars
    bias = b.op("Where", allowed, zero_bias, lowest)  # [S, M]
    return positions, b.op("Unsqueeze", bias, b.const([0, 1]))  # [1, S], [1, 1, S, M]


def tree_inputs(b: GraphBuilder, max_nodes: int, dtype: int) -> tuple[Value, Value]:
    """(position_ids int64 [1, S], attention_bias `dtype` [1, 1, S, M]) from input_ids, attention_mask and parents
    (the module docstring's math)."""
    zero, one = b.const([0]), b.const([1])
    seq = b.op("Shape", names.INPUT_IDS, start=1, end=2)  # [1] S (host)
    count = b.op("Shape", names.PARENTS, start=1, end=2)  # [1] T (host)
    max_len = b.op("Shape", names.ATTENTION_MASK, start=1, end=2)  # [1] M (host)
    before = b.op("Sub", seq, count)  # [1] S - T, the rows before the nodes (host)
    end = b.reduce("ReduceSum", names.ATTENTION_MASK, axis=1, keepdims=False)  # [1] L + S (device)
    start = b.op("Sub", end, b.shape_value(seq))  # [1] L
    anc = ancestor_mask(b, b.op("Squeeze", names.PARENTS, zero), max_nodes)  # [T, T] fp32 1 / 0
    # positions: L + s for the rows before the nodes, L + (S - T - 1) + depth for node i
    rows = _range(b, before)  # [S-T]
    nodes = b.op("Add", depths(b, anc), b.shape_value(b.op("Sub", before, one)))  # [T]
    positions = b.op("Unsqueeze", b.op("Add", b.op("Concat", rows, nodes, axis=0), start), zero)  # [1, S]
    # the bias: node a[c] of each cache row c (T: not a node), ext[:, a]
    total = b.shape_value(count)  # [1] T (device)
    first = b.op("Sub", end, total)  # [1] the first node's cache row
    node = b.op("Sub", _range(b, max_len), first)  # [M]
    inside = b.op("And", b.op("GreaterOrEqual", node, b.const(0)), b.op("Less", node, total))
    node = b.op("Where", inside, node, total)  # [M]
    ones = onnx.numpy_helper.from_array(np.ones(1, np.float32))
    chain = b.op("ConstantOfShape", b.op("Concat", before, b.op("Add", count, one), axis=0), value=ones)  # [S-T, T+1]
    tree = b.op("Concat", anc, b.op("ConstantOfShape", b.op("Concat", count, one, axis=0), value=ones), axis=1)
    allowed = b.op("Gather", b.op("Concat", chain, tree, axis=0), node, axis=1)  # [S, M] fp32 1 / 0
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    zero_bias, lowest = b.const(0, np_dtype), b.const(np.finfo(np_dtype).min, np_dtype)  # scalars
    bias = b.op("Where", b.op("Cast", allowed, to=onnx.TensorProto.BOOL), zero_bias, lowest)  # [S, M]
    return positions, b.op("Unsqueeze", bias, b.const([0, 1]))  # [1, S], [1, 1, S, M]


def _range(b: GraphBuilder, size: Value) -> Value:
    """[0 .. size - 1] int64 for a host shape value `size` [1] (a Range over shapes: computed on the device)."""
    return b.op("Range", b.const(0), b.op("Squeeze", size, b.const([0])), b.const(1))


def _check_attention(plain: Path, attention: list[onnx.NodeProto], context_length: int) -> None:
    """A SpecpackError unless every GroupQueryAttention applies the rotary itself (it then reads position_ids), has
    no position_ids / attention_bias yet, and no sliding window that can bind (a node's cache row is not its
    position: a window counted in rows would cut the wrong keys; the torch form's rule)."""
    for node in attention:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        taken = [node.input[i] for i in (POSITION_IDS_SLOT, ATTENTION_BIAS_SLOT) if i < len(node.input)]
        window = int(attrs.get("local_window_size", -1))
        problem = ("the rotary outside it (do_rotary 0): position_ids would not reach it" if not attrs.get("do_rotary")
                   else f"position_ids / attention_bias already fed ({taken})" if any(taken)
                   else f"sliding window {window} < the context length {context_length}"
                   if 0 <= window < context_length else None)
        if problem is not None:
            raise SpecpackError(f"{plain}: the tree form cannot be added to the builder's {node.name}: {problem}",
                                expected="GroupQueryAttention with do_rotary 1, inputs 9 and 10 free, no binding "
                                         "sliding window", found=problem,
                                hint="export without --max-tree-nodes, or with --graphs torch")
