"""Drive plain (or verify) graphs of both KV cache forms token by token, for tests: an ONNX Runtime session and a
cache, nothing of runtime/'s engines.

    StaticRunner(graph, info, max_len)  static form: StaticKVCache, present.* bound onto past.* (in place)
    ConcatRunner(graph, info)           concat form: past [1, H, L, D] in, present [1, H, L + S, D] out

Both: `run(ids [S], **extra inputs) -> {output name: array}` over the next S tokens, `rollback(length)`,
and `length`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from specpack import names
from specpack.runtime.static_kv_cache import StaticKVCache


def session(path: Path) -> ort.InferenceSession:
    """One intra-op thread: a test worker is pinned to one core (tests/conftest.py), where ONNX Runtime's default (a
    spinning thread per physical core) took the tensorrt-form chi-square from about 8 s alone to 28-35 s in the suite."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _positions(start: int, ids: np.ndarray) -> dict[str, np.ndarray]:
    return {names.INPUT_IDS: ids.reshape(1, -1).astype(np.int64),
            names.POSITION_IDS: np.arange(start, start + ids.size, dtype=np.int64)[None]}


class StaticRunner:
    def __init__(self, graph: Path, info: Any, max_len: int, dtype: type = np.float32) -> None:
        self.session = session(graph)
        self.cache = StaticKVCache(info.num_layers, info.kv_heads, info.head_dim, max_len, dtype)
        self.binding = self.session.io_binding()
        self.outputs = [o.name for o in self.session.get_outputs() if not o.name.startswith("present.")]

    @property
    def length(self) -> int:
        return self.cache.length

    def run(self, ids: np.ndarray, **extra: np.ndarray) -> dict[str, np.ndarray]:
        n = ids.size
        inputs = {**self.cache.bind_inputs(n), **_positions(self.cache.length, ids), **extra}
        for name, array in inputs.items():
            self.binding.bind_input(name, "cpu", 0, array.dtype.type, array.shape, array.ctypes.data)
        for name in self.outputs:  # bound first: get_outputs() keeps the order of the first binding
            self.binding.bind_output(name, "cpu")
        for name, array in self.cache.bind_outputs(n).items():  # the past buffers themselves
            self.binding.bind_output(name, "cpu", 0, array.dtype.type, array.shape, array.ctypes.data)
        self.session.run_with_iobinding(self.binding)
        self.cache.advance(n)
        return dict(zip(self.outputs, (v.numpy() for v in self.binding.get_outputs()[: len(self.outputs)]),
                        strict=True))

    def rollback(self, length: int) -> None:
        self.cache.rollback(length)


class ConcatRunner:
    def __init__(self, graph: Path, info: Any, dtype: type = np.float32) -> None:
        self.session = session(graph)
        self.past = [np.zeros((1, info.kv_heads, 0, info.head_dim), dtype) for _ in range(2 * info.num_layers)]
        self.past_names = names.kv_names(info.num_layers, "past")
        self.outputs = [o.name for o in self.session.get_outputs() if not o.name.startswith("present.")]

    @property
    def length(self) -> int:
        return self.past[0].shape[2]

    def run(self, ids: np.ndarray, **extra: np.ndarray) -> dict[str, np.ndarray]:
        feeds = {**_positions(self.length, ids), **dict(zip(self.past_names, self.past, strict=True)), **extra,
                 names.ATTENTION_MASK: np.ones((1, self.length + ids.size), np.int64)}
        out = self.session.run(None, feeds)
        self.past = out[len(self.outputs):]
        return dict(zip(self.outputs, out[: len(self.outputs)], strict=True))

    def rollback(self, length: int) -> None:
        self.past = [np.ascontiguousarray(p[:, :, :length]) for p in self.past]
