"""graphs/element_scatter.py: row writes by ScatterND widened to one element per index. The same values out of ONNX
Runtime for the same inputs (rows written anywhere in the cache, other rows untouched), and every cache write of the
packs the cuda backend opens is rewritten (the KV caches of the static standard form, the head's features cache, the
tree packs' kv_compact.onnx). The backend's own tests (tests/runtime/test_cuda_*.py) run the rewritten graphs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from specpack.graphs.element_scatter import element_scatter, element_scatter_bytes


def _row_write_model() -> onnx.ModelProto:
    """present = ScatterND(past [1, 2, 8, 5], (0, h, start + s) [1, 2, S, 3], new [1, 2, S, 5]), as kv_write builds it."""
    nodes = [
        helper.make_node("Shape", ["new"], ["seq"], start=2, end=3),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", TensorProto.INT64, [], [0])),
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("o", TensorProto.INT64, [], [1])),
        helper.make_node("Constant", [], ["axes"], value=helper.make_tensor("a", TensorProto.INT64, [1], [0])),
        helper.make_node("Squeeze", ["seq", "axes"], ["seq_scalar"]),
        helper.make_node("Range", ["zero", "seq_scalar", "one"], ["steps"]),
        helper.make_node("Add", ["steps", "start"], ["rows"]),  # [S]
        helper.make_node("Constant", [], ["rows_shape"], value=helper.make_tensor("r", TensorProto.INT64, [4], [1, 1, -1, 1])),
        helper.make_node("Reshape", ["rows", "rows_shape"], ["rows4"]),  # [1, 1, S, 1]
        helper.make_node("Constant", [], ["heads"], value=helper.make_tensor("h", TensorProto.INT64, [1, 2, 1, 1], [0, 1])),
        helper.make_node("Constant", [], ["grid1"], value=helper.make_tensor("g", TensorProto.INT64, [2], [1, 2])),
        helper.make_node("Constant", [], ["grid2"], value=helper.make_tensor("g2", TensorProto.INT64, [1], [1])),
        helper.make_node("Concat", ["grid1", "seq", "grid2"], ["grid"], axis=0),  # [1, 2, S, 1]
        helper.make_node("Expand", ["zero", "grid"], ["b"]),
        helper.make_node("Expand", ["heads", "grid"], ["h_idx"]),
        helper.make_node("Expand", ["rows4", "grid"], ["s_idx"]),
        helper.make_node("Concat", ["b", "h_idx", "s_idx"], ["indices"], axis=-1),  # [1, 2, S, 3]
        helper.make_node("ScatterND", ["past", "indices", "new"], ["present"]),
    ]
    graph = helper.make_graph(nodes, "row_write", [
        helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, 2, 8, 5]),
        helper.make_tensor_value_info("new", TensorProto.FLOAT, [1, 2, "S", 5]),
        helper.make_tensor_value_info("start", TensorProto.INT64, [1]),
    ], [helper.make_tensor_value_info("present", TensorProto.FLOAT, [1, 2, 8, 5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["present"], feeds)[0])


def test_the_widened_write_gives_the_same_cache() -> None:
    plain, widened = _row_write_model(), _row_write_model()
    assert element_scatter(widened) == 1
    onnx.checker.check_model(widened, full_check=True)
    scatter = next(n for n in widened.graph.node if n.op_type == "ScatterND")
    assert scatter.input[1] != "indices"  # its indices now come from the rewrite
    rng = np.random.default_rng(0)
    for seq, start in ((1, 0), (2, 3), (5, 3), (8, 0)):
        feeds = {"past": rng.standard_normal((1, 2, 8, 5)).astype(np.float32),
                 "new": rng.standard_normal((1, 2, seq, 5)).astype(np.float32), "start": np.array([start], np.int64)}
        want = _run(plain, feeds)
        np.testing.assert_array_equal(_run(widened, feeds), want)
        np.testing.assert_array_equal(want[:, :, start : start + seq], feeds["new"])  # the rows, and only them
        untouched = np.ones(8, bool)
        untouched[start : start + seq] = False
        np.testing.assert_array_equal(want[:, :, untouched], feeds["past"][:, :, untouched])


def test_a_model_without_row_writes_is_returned_as_is() -> None:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "plain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    data = helper.make_model(graph).SerializeToString()
    assert element_scatter_bytes(data) is data


def _scatters(path: Path) -> tuple[int, int]:
    """(ScatterND nodes, how many the rewrite widened) of a pack graph, weights not loaded; the rewrite makes no host
    value enter the data (else the CUDA EP adds a Memcpy and refuses CUDA graphs: tests/graphs/host_values.py)."""
    from tests.graphs.host_values import host_values_in_data

    model = onnx.load(str(path), load_external_data=False)
    count = sum(n.op_type == "ScatterND" for n in model.graph.node)
    before = host_values_in_data(model)
    widened = element_scatter(model)
    assert host_values_in_data(model) == before  # the rewrite adds none (a graph as exported may have its own)
    return count, widened


@pytest.mark.parametrize("graph", ["verify.onnx", "draft_step.onnx"])
def test_every_cache_write_of_a_static_standard_pack_is_widened(tiny_pack: Callable[..., tuple[Path, Path, Path]],
                                                                 graph: str) -> None:
    pack = tiny_pack("qwen2", "noisy", kv_cache="static", attention="standard", k=4)[0]
    count, widened = _scatters(pack / graph)
    assert count >= 2 and widened == count  # a key and a value write per layer


def test_the_features_cache_and_kv_compact_writes_are_widened(tiny_head_pack: Callable[..., tuple[Path, Path, Path]],
                                                              tiny_export: Callable[..., Path]) -> None:
    head_pack = tiny_head_pack("qwen2", kv_cache="static")[0]
    count, widened = _scatters(head_pack / "verify.onnx")
    assert count >= 1 and widened == count
    tree_pack = tiny_export("qwen2", "small", k=4, max_len=64, kv_cache="static", max_tree_nodes=16)
    compact = next(tree_pack.rglob("kv_compact.onnx"))
    count, widened = _scatters(compact)
    assert count >= 2 and widened == count
