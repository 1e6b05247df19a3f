"""spec-export --max-batch with weight-only quantization (docs/batching.md, "What remains" 2): the batched form of a
model is quantized with its batch-1 graph's weights (quantize/stage.py, quantize_graph_pair), bit for bit, and its
tensors read from the batch-1 graph's data file; its rows do not depend on the batch (MatMulNBits computes each row
alone on this CPU). The pack end to end: tests/runtime/test_batched_quantized.py (slow: it exports)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from specpack import names
from specpack.errors import SpecpackError
from specpack.graphs.attach import build_batched_greedy_graph
from specpack.quantize.nbits import quantize_kquant
from specpack.quantize.stage import quantize_graph_pair

QUANTIZED_OPS = ("MatMulNBits", "GatherBlockQuantized")


@pytest.fixture(scope="module", params=["int4", "int8"])
def pair(request: pytest.FixtureRequest, tiny_plain_graph: Callable[..., Path], tiny_batched_plain: Callable[..., Path],
         tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict, dict]:  # type: ignore[type-arg]
    """The tiny qwen2 target's batch-1 (concat) graph and batched form, quantized together into one folder."""
    out = tmp_path_factory.mktemp(f"pair-{request.param}")
    first, second = out / f"target.{request.param}.onnx", out / f"target-batched.{request.param}.onnx"
    record, batched = quantize_graph_pair(tiny_plain_graph("qwen2"), first, tiny_batched_plain("qwen2"), second,
                                          request.param)
    return first, second, record, batched


def _quantized_inputs(path: Path) -> dict[str, onnx.TensorProto]:
    """The initializers the quantized ops read, by name."""
    graph = onnx.load(str(path), load_external_data=False).graph
    inits = {t.name: t for t in graph.initializer}
    return {name: inits[name] for n in graph.node if n.op_type in QUANTIZED_OPS for name in n.input if name in inits}


def _external(t: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


def test_the_batched_form_has_the_batch1_weights_from_its_data_file(pair: tuple[Path, Path, dict, dict]) -> None:  # type: ignore[type-arg]
    first, second, record, batched = pair
    ours, theirs = _quantized_inputs(first), _quantized_inputs(second)  # names differ (torch's val_N): by content

    def stored(tensors: dict[str, onnx.TensorProto]) -> set[tuple[str, ...]]:
        """Each tensor's place in an external file (location, offset, length), or its inline bytes."""
        return {tuple(_external(t).values()) if t.data_location == TensorProto.EXTERNAL else (t.raw_data.hex(),)
                for t in tensors.values()}

    assert ours and len(theirs) == len(ours) and stored(theirs) == stored(ours)  # the same bytes, in the same place
    shared = batched["shared"]
    assert shared["weights_reused"] == shared["weights_quantized"] == sum(
        r["path"] not in ("kept", "shared") for r in record["tensors"])
    assert shared["tensors_shared"] >= len([t for t in theirs.values() if t.data_location == TensorProto.EXTERNAL])
    assert "shared" not in record and batched["summary"] == record["summary"]
    graph = onnx.load(str(second), load_external_data=False).graph  # every external tensor is the first file's
    assert {_external(t)["location"] for t in graph.initializer if t.data_location == TensorProto.EXTERNAL} == \
        {f"{first.name}.data"}


def _batched_logits(session: ort.InferenceSession, ids: np.ndarray, width: int = 16) -> np.ndarray:
    """Logits [B, S, V] of rows prefilled from empty caches."""
    rows, seq = ids.shape
    feeds = {names.INPUT_IDS: ids, names.POSITION_IDS: np.tile(np.arange(seq), (rows, 1)),
             names.ATTENTION_MASK: (np.arange(width)[None] < seq).repeat(rows, 0).astype(np.int64)}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values"):
            feeds[i.name] = np.zeros((rows, i.shape[1], width, i.shape[3]), np.float32)
    return session.run([names.LOGITS], feeds)[0]


def test_quantized_rows_do_not_depend_on_the_batch(pair: tuple[Path, Path, dict, dict]) -> None:  # type: ignore[type-arg]
    """Each row of a batched run equals the same row run alone, bit for bit (and a two-token prefix of a row its
    shorter run: no greedy run of the runtime has fewer than two rows, docs/architecture.md "One row is never run alone")."""
    session = ort.InferenceSession(str(pair[1]), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(0).integers(0, 200, (4, 6))
    together = _batched_logits(session, ids)
    for b in range(4):
        assert np.array_equal(_batched_logits(session, ids[b:b + 1])[0], together[b])
    assert np.array_equal(_batched_logits(session, ids[:1, :2])[0], together[0, :2])


@pytest.mark.parametrize(("k", "n"), [(1536, 1536), (8960, 1536)])  # the real 1.5B target's projections
def test_matmul_nbits_rows_do_not_depend_on_m(k: int, n: int) -> None:
    """MatMulNBits (int4, accuracy level 4: int8 activations) at the real pair's sizes: rows 0..M-1 of a run of M
    rows equal those of a run of 16 for every M >= 2, so a quantized batched row is the row alone (docs/batching.md).
    M = 1 is not asked: ONNX Runtime 1.32's one-row kernel rounds apart on some CPUs (the 2-core AMD EPYC, AVX2
    without VNNI: up to 1.3e-5 at 8960 x 1536, 2026-12-07), which is why no greedy run of the runtime has one row
    (docs/architecture.md, "One row is never run alone")."""
    rng = np.random.default_rng(0)
    bq = quantize_kquant(rng.standard_normal((k, n)).astype(np.float32) * 0.02, 4, 32)
    assert bq.zero_points is not None
    node = helper.make_node("MatMulNBits", ["x", "B", "scales", "zp"], ["y"], domain="com.microsoft", K=k, N=n,
                            bits=4, block_size=32, accuracy_level=4)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
                              [numpy_helper.from_array(bq.packed, "B"), numpy_helper.from_array(bq.scales, "scales"),
                               numpy_helper.from_array(bq.zero_points, "zp")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((16, k)).astype(np.float32)
    full = session.run(None, {"x": x})[0]
    for m in (2, 3, 5, 9):
        assert np.array_equal(session.run(None, {"x": x[:m]})[0], full[:m]), m


def test_a_shared_data_file_must_be_in_the_pack_first(pair: tuple[Path, Path, dict, dict], tmp_path: Path) -> None:  # type: ignore[type-arg]
    first, second = pair[0], pair[1]
    for path in second.parent.iterdir():
        if path.name.startswith(second.name):
            shutil.copy(path, tmp_path / path.name)
    pack = tmp_path / "pack"
    pack.mkdir()
    with pytest.raises(SpecpackError, match="shared external-data file is not in the pack") as err:
        build_batched_greedy_graph(tmp_path / second.name, pack / "draft_batched.onnx", 320,
                                   in_pack={f"{first.name}.data": "draft_step.onnx.data"})
    assert err.value.hint
