"""Buffers allocated once on an ONNX Runtime device, bound by pointer, and the static KV cache built on them.

    DeviceArray          one OrtValue on the device (zero-filled at allocation); views by pointer offset
    DeviceView           (ptr, shape, dtype): what an IOBinding binds; a view of a DeviceArray, no copy
    bind                 views bound to an IOBinding by pointer
    DeviceStaticKVCache  the static cache (runtime/static_kv_cache.py) with its buffers and mask on the device;
                         after a tree verify its rows move by kv_compact.onnx, run by the engine's `compact`

Host -> device copies go through `OrtValue.update_inplace` (the buffer keeps its address: what CUDA graph
replay needs); device -> host through `OrtValue.numpy()`. Per run the cache uploads only its mask
([1, max_len] int64, a few KB), and only when the length changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import onnxruntime as ort

from specpack import names
from specpack.runtime.static_kv_cache import StaticLengthCache


class DeviceView(NamedTuple):
    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype


class DeviceArray:
    """A buffer of `shape` allocated once on `device` ("cuda" or "cpu"), zero-filled (or a copy of `host`)."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype | type, device: str, device_id: int = 0,
                 host: np.ndarray | None = None) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        first = np.zeros(self.shape, self.dtype) if host is None else np.ascontiguousarray(host, self.dtype)
        self.value = ort.OrtValue.ortvalue_from_numpy(first, device, device_id)
        self.ptr: int = self.value.data_ptr()

    def view(self, shape: tuple[int, ...] | None = None, offset: int = 0) -> DeviceView:
        """The elements [offset, offset + prod(shape)) as `shape` (default: the whole buffer)."""
        shape = self.shape if shape is None else tuple(shape)
        return DeviceView(self.ptr + offset * self.dtype.itemsize, shape, self.dtype)

    def write(self, host: np.ndarray) -> None:
        """Copy `host` (the buffer's size and dtype) in; the address does not change."""
        self.value.update_inplace(host)

    def read(self) -> np.ndarray:
        return self.value.numpy()


def bind(binding: Any, device: str, inputs: Mapping[str, DeviceView | np.ndarray],
         outputs: Mapping[str, DeviceView | np.ndarray], wanted: set[str] | None = None) -> None:
    """Bind by pointer: a DeviceView on `device`, a host array (C-contiguous) on the CPU, which ONNX Runtime copies to
    and from the device around the run; `wanted`: the graph's inputs (others are skipped), None: all."""
    for name, v in inputs.items():
        if wanted is None or name in wanted:
            binding.bind_input(name, *_where(device, v))
    for name, v in outputs.items():
        binding.bind_output(name, *_where(device, v))


def _where(device: str, v: DeviceView | np.ndarray) -> tuple[str, int, type, tuple[int, ...], int]:
    """(device, device id, element type, shape, pointer) of a view or a host array."""
    if isinstance(v, np.ndarray):
        return "cpu", 0, v.dtype.type, v.shape, v.ctypes.data
    return device, 0, v.dtype.type, v.shape, v.ptr


class DeviceStaticKVCache(StaticLengthCache):
    """The static cache (runtime/static_kv_cache.py) over device buffers [1, H, max_len, D], past bound as present.

    The mask [1, max_len] lives on the host and on the device: bind_inputs edits the host copy between the old
    and new end and uploads it. Every call returns the same views: fixed addresses for captured graphs.

    After a tree verify (docs/trees.md, "kv_compact.onnx"), `keep_rows` moves the accepted path's rows on the device:
    the engine that ran the verify says so (`tree_verified(T)`) and sets `compact`, which runs kv_compact.onnx over
    its path buffer, this cache's buffers (present onto past) and the mask the verify ran with (still bound then:
    nothing runs between the verify and keep_rows).
    """

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, max_len: int, dtype: np.dtype | type,
                 device: str, device_id: int = 0) -> None:
        shape = (1, kv_heads, max_len, head_dim)
        self._buffers = [DeviceArray(shape, dtype, device, device_id) for _ in range(2 * num_layers)]
        self._mask = DeviceArray((1, max_len), np.int64, device, device_id)
        views = [b.view() for b in self._buffers]
        past, present = names.kv_names(num_layers, "past"), names.kv_names(num_layers, "present")
        super().__init__(max_len, {names.ATTENTION_MASK: self._mask.view(), **dict(zip(past, views, strict=True))},
                         dict(zip(present, views, strict=True)), np.zeros((1, max_len), np.int64))
        self.compact: Callable[[int], None] | None = None  # runs kv_compact.onnx over the last tree verify of T nodes
        self._tree_nodes: int | None = None  # T of the tree verify that ran last; None: the last run was not one

    def bound(self) -> tuple[dict[str, DeviceView], dict[str, DeviceView]]:
        """The mask and past views, and the present views (the same buffers), without touching the mask."""
        return self._inputs, self._outputs

    def tree_verified(self, nodes: int) -> None:
        """A tree verify of `nodes` nodes (T) just ran over rows up to this cache's length; its path is on the device."""
        self._tree_nodes = nodes

    def advance(self, n_new: int) -> None:
        self._tree_nodes = None  # any run after a tree verify: its rows can no longer be moved
        super().advance(n_new)

    def keep_rows(self, start: int, rows: np.ndarray) -> None:
        """Rows start + rows[i] -> start + i (rows: the accepted nodes of the tree verify that just ran, start its first
        node's row), by kv_compact.onnx on the device; a chain's path (rows 0, 1, .., n - 1) moves nothing."""
        nodes = self._tree_nodes
        if self.compact is None or nodes is None or start + nodes != self.length or self.length != self._mask_end:
            raise RuntimeError(f"keep_rows({start}, {len(rows)} rows): expected right after a tree verify ending at "
                               f"{start} + T (the cache holds {self.length}, T {nodes}, compaction "
                               f"{'set' if self.compact else 'not set'})")
        if np.array_equal(rows, np.arange(len(rows))):
            return  # the identity path: every accepted row is already in place
        self.compact(nodes)

    def _mask_changed(self, low: int, high: int) -> None:
        self._mask.write(self._mask_host)  # the whole [1, max_len]: update_inplace copies whole values
