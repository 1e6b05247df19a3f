"""The batched greedy head with its row count from shapes (docs/batching.md, "On the GPU"): what the cuda backend opens
for a batched graph whose head is the argmax (draft_batched.onnx), so that ONNX Runtime can capture its decode steps.

As exported (graphs/batched_head.py, `batched_greedy_head_io`) the head reads K + 1 = max k_b + 1 positions of every
row, K from the data (ReduceMax over draft_counts): a run's output shape then follows a device value, which the CUDA EP
copies to the host (a Memcpy node) and a CUDA graph cannot replay. Here

    K + 1 = min(S, rows)      S = input_ids' width, rows = the pack's k_max + 1 (the most a row ever verifies)

from shapes and a constant alone, under the same output name: best [B, min(S, rows)], whose first k_b + 1 columns are
the exported head's best[b, :k_b + 1] (both read positions S_b - k_b - 1 + i, i = 0, 1, ...; k_b + 1 <= S_b <= S and
k_b <= k_max), the rest clamped positions a caller never reads. The lm_head then computes min(S, rows) rows per batch
row, at most k_max + 1 as before for a long catch-up, and S (1 or 2) for a decode step. The cpu backend keeps the head
as exported: it captures nothing, and there every lm_head row past the first costs (bench/README.md, "Where a verify's
cost comes from"), where a draft step's S = 2 would compute two.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from specpack import names


def batched_fixed_rows(path: Path, data: bytes | None = None, *, rows: int) -> bytes:
    """The graph at `path` (weights not loaded; or its bytes, `data`) with its head's K from shapes, serialized.

    A graph without draft_counts (a pack exported before 2026-12-06: its head reads every position, best [B, S]) is
    returned as it is: its rows follow a shape already. Raises ValueError when a graph with draft_counts has no
    batched greedy head (one ReduceMax over draft_counts, an output `best`)."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    model = onnx.load_from_string(data) if data is not None else onnx.load(str(path), load_external_data=False)
    graph = model.graph
    if names.DRAFT_COUNTS not in {i.name for i in graph.input}:
        return model.SerializeToString()
    found = [n for n in graph.node if n.op_type == "ReduceMax" and list(n.input[:1]) == [names.DRAFT_COUNTS]]
    if len(found) != 1 or names.BEST not in {o.name for o in graph.output}:
        raise ValueError(f"{path.name}: expected the batched greedy head (one ReduceMax over {names.DRAFT_COUNTS}, an "
                         f"output {names.BEST}), found {len(found)} such ReduceMax")
    k = found[0].output[0]  # [1] K (keepdims): the exported head adds one and ranges over it
    p = "batched_fixed_rows_"
    replacement = [
        helper.make_node("Shape", [names.INPUT_IDS], [p + "s"], name=p + "s", start=1, end=2),  # [1] S
        helper.make_node("Constant", [], [p + "rows"], name=p + "rows",
                         value=helper.make_tensor(p + "rows", TensorProto.INT64, [1], [rows])),
        helper.make_node("Constant", [], [p + "one"], name=p + "one",
                         value=helper.make_tensor(p + "one", TensorProto.INT64, [1], [1])),
        helper.make_node("Min", [p + "s", p + "rows"], [p + "k1"], name=p + "k1"),          # [1] min(S, rows)
        helper.make_node("Sub", [p + "k1", p + "one"], [k], name=found[0].name),             # [1] K
    ]
    at = list(graph.node).index(found[0])
    nodes = [*graph.node[:at], *replacement, *graph.node[at + 1:]]
    del graph.node[:]
    graph.node.extend(nodes)
    return model.SerializeToString()
