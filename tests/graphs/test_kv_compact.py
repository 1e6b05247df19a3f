"""kv_compact.onnx against numpy on ONNX Runtime's CPU EP: the accepted path's rows moved into place, nothing else
touched below the new length, and the same result with each present.* bound onto its past buffer (in place), where
it writes only the T + 1 rows after the root (kv_compact_probe.py, the child, write-protects every other page)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from specpack import names
from specpack.graphs import tree_oracle
from specpack.graphs.kv_compact import kv_compact_model

from .cases import cpu_session

LAYERS, HEADS, HEAD_DIM, CACHE = 2, 3, 4, 96
F32 = np.float32


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    return cpu_session(kv_compact_model(LAYERS, HEADS, HEAD_DIM))


def _case(rng: np.random.Generator) -> tuple[np.ndarray, int, int]:
    """A random tree's accepted path as the graph's `path` [1, T+1], the root's row R and the path's length n."""
    t = int(rng.choice([0, 1, 2, 5, 13, 64]))
    parents = np.array([int(rng.integers(max(-1, j - 3), j)) if rng.random() < 0.7 else int(rng.integers(-1, j))
                        for j in range(t)], np.int64)
    node = int(rng.integers(-1, t))  # the deepest accepted node (-1: none)
    path: list[int] = []
    while node >= 0:
        path.append(node)
        node = int(parents[node])
    verdict = tree_oracle.TreeVerdict(tuple(path[::-1]), 0)
    root = int(rng.integers(0, CACHE - t))
    return verdict.rows(t + 1)[None], root, verdict.n_accepted


def _expected(cache: np.ndarray, path: np.ndarray, root: int, n: int) -> np.ndarray:
    out = cache.copy()
    out[:, :, root: root + n + 1] = cache[:, :, root + path[0, : n + 1]]  # rows R + d <- R + path[d]
    return out


def test_kv_compact_moves_the_accepted_rows(session: ort.InferenceSession) -> None:
    rng = np.random.default_rng(23)
    for _ in range(200):
        path, root, n = _case(rng)
        mask = np.zeros((1, CACHE), np.int64)
        mask[0, : root + path.shape[1]] = 1  # the verify's: ones at [0, R + T + 1)
        cache = {name: rng.standard_normal((1, HEADS, CACHE, HEAD_DIM)).astype(F32)
                 for name in names.kv_names(LAYERS, "past")}
        out = session.run(names.kv_names(LAYERS, "present"), {names.ATTENTION_MASK: mask, names.PATH: path, **cache})
        for got, past in zip(out, cache.values(), strict=True):
            want = _expected(past, path, root, n)
            assert np.array_equal(got[:, :, : root + n + 1], want[:, :, : root + n + 1]), (path, root)
            assert np.array_equal(got[:, :, : root], past[:, :, : root])  # the committed prefix is untouched


def test_kv_compact_moves_a_head_packs_features_rows() -> None:
    """With feature_dim (a head tree pack), the features cache [1, 1, M, F] moves the same rows as the KV cache."""
    features_dim = 7
    session = cpu_session(kv_compact_model(LAYERS, HEADS, HEAD_DIM, feature_dim=features_dim))
    rng = np.random.default_rng(29)
    moved = 0
    for _ in range(60):
        path, root, n = _case(rng)
        mask = np.zeros((1, CACHE), np.int64)
        mask[0, : root + path.shape[1]] = 1
        cache = {name: rng.standard_normal((1, HEADS, CACHE, HEAD_DIM)).astype(F32)
                 for name in names.kv_names(LAYERS, "past")}
        features = rng.standard_normal((1, 1, CACHE, features_dim)).astype(F32)
        out = session.run([*names.kv_names(LAYERS, "present"), names.TARGET_FEATURES],
                          {names.ATTENTION_MASK: mask, names.PATH: path, **cache,
                           names.PAST_TARGET_FEATURES: features})
        want = _expected(features, path, root, n)
        assert np.array_equal(out[-1][:, :, : root + n + 1], want[:, :, : root + n + 1]), (path, root)
        assert np.array_equal(out[0][:, :, : root + n + 1], _expected(cache[names.past_name(0, "key")], path, root,
                                                                      n)[:, :, : root + n + 1])
        moved += not np.array_equal(want, features)
    assert moved >= 10  # most paths move rows: the test would see a no-op


def test_kv_compact_in_place(session: ort.InferenceSession) -> None:
    """Each present.* bound onto its past.* OrtValue (as the runtime binds the static cache): the buffers hold the
    compacted cache afterwards, and the chain's path (0, 1, .., n) leaves them as they were."""
    rng = np.random.default_rng(24)
    for _ in range(50):
        path, root, n = _case(rng)
        mask = np.zeros((1, CACHE), np.int64)
        mask[0, : root + path.shape[1]] = 1
        host = {name: rng.standard_normal((1, HEADS, CACHE, HEAD_DIM)).astype(F32)
                for name in names.kv_names(LAYERS, "past")}
        before = {name: array.copy() for name, array in host.items()}
        binding = session.io_binding()
        binding.bind_cpu_input(names.ATTENTION_MASK, mask)
        binding.bind_cpu_input(names.PATH, path)
        for past, present in zip(names.kv_names(LAYERS, "past"), names.kv_names(LAYERS, "present"), strict=True):
            value = ort.OrtValue.ortvalue_from_numpy(host[past])  # shares host[past]'s memory
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)
        session.run_with_iobinding(binding)
        for name, array in host.items():
            want = _expected(before[name], path, root, n)
            assert np.array_equal(array[:, :, : root + n + 1], want[:, :, : root + n + 1]), (path, root)


def test_kv_compact_writes_only_the_tree_rows() -> None:
    """In place and nothing else: with every page outside rows [R, R + T] write-protected, the run succeeds (a copy of
    the buffer, or a write anywhere else, kills the child with SIGSEGV: checked by hand) and compacts the cache."""
    probe = Path(__file__).with_name("kv_compact_probe.py")
    proc = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"child exited {proc.returncode} (negative: killed by that signal)\n{proc.stderr}"
    report = json.loads(proc.stdout)
    assert report["compacted"] and report["protected_pages"] >= report["pages"] - 2 * 2 * 2 * 2  # <= 2 pages a head


def test_no_host_value_enters_the_data() -> None:
    """The CUDA EP captures kv_compact.onnx only without Memcpy nodes: no shape value may enter its data directly
    (on the H200 the first form, R = ReduceSum(mask) - Shape(path), was refused capture). The check flags that form."""
    from onnx import TensorProto, helper

    from specpack.graphs.onnx_builder import GraphBuilder

    from .host_values import host_values_in_data

    assert host_values_in_data(kv_compact_model(LAYERS, HEADS, HEAD_DIM, "fp16")) == []
    b = GraphBuilder(18)  # the first form: a Shape's output subtracted from device data
    total = b.reduce("ReduceSum", names.ATTENTION_MASK, axis=1, keepdims=False)
    b.op("Sub", total, b.op("Shape", names.PATH, start=1, end=2))
    b.nodes[-1].output[0] = "root"
    first = helper.make_model(helper.make_graph(
        b.nodes, "first", [helper.make_tensor_value_info(names.ATTENTION_MASK, TensorProto.INT64, [1, 8]),
                           helper.make_tensor_value_info(names.PATH, TensorProto.INT64, [1, 3])],
        [helper.make_tensor_value_info("root", TensorProto.INT64, [1])]))
    (problem,) = host_values_in_data(first)
    assert "(Sub) input 1" in problem
