"""Where a batched engine's KV caches live, and how one run binds them (runtime/batched_target.py's BatchedRuns).

    per cache tensor one buffer [slots, kv_heads, M, head_dim], past bound as present (written in place); a run over
    the slots [lo, hi) binds their rows: contiguous along the first axis, so the range is the buffer from offset
    lo * kv_heads * M * head_dim, shape [hi - lo, kv_heads, M, head_dim]

    HostCaches    numpy buffers, the range a numpy view (the cpu backend)
    BatchedCaches what BatchedRuns asks of either: `rows(lo, hi)` (the past and present bindings of the range),
                  `run(inputs, outputs)`, `close()`; the device form is backends/cuda_batched.py's DeviceCaches

A run's other inputs and outputs (ids, positions, mask, the head's) are host arrays in both forms; on a device
ONNX Runtime copies them in and out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

import numpy as np

from specpack import names

if TYPE_CHECKING:
    from specpack.runtime.device_buffers import DeviceView
    from specpack.runtime.ort_session import OrtGraph

Bound: TypeAlias = "np.ndarray | DeviceView"  # what a run binds: a host array, or a view of a device buffer


@dataclass(frozen=True)
class KVLayout:
    """The caches' geometry: one buffer [slots, kv_heads, width, head_dim] of `dtype` per past / present pair."""

    num_layers: int
    kv_heads: int
    head_dim: int
    width: int        # M: cache rows per slot (max_len + k_max + 1: a padded row never runs off the buffer)
    slots: int
    dtype: np.dtype

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.slots, self.kv_heads, self.width, self.head_dim)

    @property
    def row_elements(self) -> int:
        """Elements of one slot's rows in one buffer: the stride of the first axis."""
        return self.kv_heads * self.width * self.head_dim

    def names(self) -> tuple[list[str], list[str]]:
        """The past and present names, buffer i bound under both i-th names."""
        return names.kv_names(self.num_layers, "past"), names.kv_names(self.num_layers, "present")


class BatchedCaches(Protocol):
    layout: KVLayout
    input_names: set[str]  # the graph's inputs (which head form it has)
    launch_bound: bool     # a run costs its launch more than its rows (a GPU): pad rows are nearly free
    fixed_rows: int | None  # a greedy head's K + 1 is min(S, fixed_rows), from shapes (graphs/batched_fixed_rows.py);
                            # None: max k_b + 1, from the data (the head as exported)

    def rows(self, lo: int, hi: int) -> tuple[dict[str, Bound], dict[str, Bound]]:
        """The slots [lo, hi) of every buffer: (past bindings, present bindings), the same memory."""
        ...

    def run(self, inputs: Mapping[str, Bound], outputs: Mapping[str, Bound], *, greedy: bool = False,
            capture: bool = False, plain: bool = False) -> None:
        """Bind everything (by pointer) and run the graph once. greedy: every row of the run is greedy (a device may run
        a greedy form); plain: every row greedy or sampling without top-k / top-p (a device may run the plain form);
        capture: a decode step's run (S <= k_max + 1), which a device may run as a CUDA graph."""
        ...

    def ignored(self, shape: tuple[int, ...], dtype: type) -> Bound:
        """An input of `shape` that no row of the run reads (a greedy batch's draft_probs [B, K, V]): a view of a
        zero buffer kept at the largest size asked, so nothing is written per run (on a device: nothing copied in)."""
        ...

    def close(self) -> None: ...


CacheOpener: TypeAlias = "Callable[[KVLayout], BatchedCaches]"  # a backend's way to allocate caches for its session


class HostCaches:
    """The caches as numpy buffers, a run through an OrtGraph's IOBinding (host memory, the CPU EP)."""

    launch_bound = False  # the CPU: a run costs its rows
    fixed_rows: int | None = None  # the graph as exported

    def __init__(self, graph: OrtGraph, layout: KVLayout) -> None:
        self.graph, self.layout = graph, layout
        self.input_names = graph.input_names
        self._binding = graph.new_binding()
        self._kv = [np.zeros(layout.shape, layout.dtype) for _ in range(2 * layout.num_layers)]  # [slots, H, M, D]
        self._past, self._present = layout.names()
        self._ignored = np.zeros(0, np.float32)  # flat; `ignored` views

    def rows(self, lo: int, hi: int) -> tuple[dict[str, Bound], dict[str, Bound]]:
        past: dict[str, Bound] = {name: kv[lo:hi] for name, kv in zip(self._past, self._kv, strict=True)}
        present: dict[str, Bound] = {name: kv[lo:hi] for name, kv in zip(self._present, self._kv, strict=True)}
        return past, present

    def run(self, inputs: Mapping[str, Bound], outputs: Mapping[str, Bound], *, greedy: bool = False,
            capture: bool = False, plain: bool = False) -> None:
        self.graph.run(self._binding, _host(inputs), _host(outputs))  # the CPU: one form, nothing captured

    def ignored(self, shape: tuple[int, ...], dtype: type) -> Bound:
        size = int(np.prod(shape))
        if self._ignored.size < size or self._ignored.dtype != np.dtype(dtype):
            self._ignored = np.zeros(size, dtype)
        return self._ignored[:size].reshape(shape)

    def close(self) -> None:
        self.graph.close()


def _host(values: Mapping[str, Bound]) -> dict[str, np.ndarray]:
    """Host arrays only: a device view here would be bound as a host pointer."""
    out = {}
    for name, value in values.items():
        if not isinstance(value, np.ndarray):
            raise TypeError(f"{name}: a device view bound to a host session")
        out[name] = value
    return out
