"""The KV cache interface every backend's engines use, and its concat-style host implementation.

    KVCache        one model's cache; positions [0, length) are valid (docs/contracts.md, "KV cache")
    LengthCache    the length bookkeeping alone (static caches build on it; the reference backend's cache)
    ConcatKVCache  present = past + new, on host buffers; rollback keeps the first L positions

An engine runs a graph over n_new new tokens as
    inputs  = {input_ids, position_ids, sampling inputs, **cache.bind_inputs(n_new)}  (+ attention_mask [1, L + n_new]
              when the cache returned none)
    outputs = {**cache.bind_outputs(n_new), ...}
    run; cache.advance(n_new); later cache.rollback(keep) after a rejection.

ConcatKVCache: each cache tensor lives in two flat buffers (ping-pong): the graph reads past [1, H, L, D]
from one and writes present [1, H, L+S, D] into the other, never onto its own input (ONNX Runtime does not
refuse that aliasing and silently corrupts the cache). Keeping the first `keep` < L positions of a
[1, H, L, D] tensor moves heads 1..H-1 down in place (head 0 is already where it belongs).
"""

from __future__ import annotations

import ctypes
from typing import Any, Protocol

import numpy as np

from specpack import names


class KVCache(Protocol):
    """One model's cache: positions [0, length) are valid."""

    length: int

    def bind_inputs(self, n_new: int) -> dict[str, Any]:
        """Every cache-related graph input for a run over n_new new tokens: the past tensors, and, for forms
        that take them, length inputs (e.g. an attention mask or seqlens). Host numpy arrays for host caches;
        a device backend's caches return its device values. The engine binds input_ids, position_ids and the
        sampling inputs itself, and attention_mask only if the cache did not return one."""
        ...

    def bind_outputs(self, n_new: int) -> dict[str, Any]:
        """The present buffers the graph writes into."""
        ...

    def advance(self, n_new: int) -> None:
        """The graph ran: length += n_new."""
        ...

    def rollback(self, length: int) -> None:
        """Keep the first `length` positions (0 <= length <= self.length)."""
        ...

    def reset(self) -> None: ...

    def keep_rows(self, start: int, rows: np.ndarray) -> None:
        """After a tree verify: rows start + rows[i] move to start + i (rows increasing, rows[i] >= i); the caller
        then rolls back to start + len(rows)."""
        ...


class LengthCache:
    """The length bookkeeping every cache shares; alone, the KVCache of a model that caches nothing (the reference
    backend's: positions it has "seen") and binds nothing."""

    def __init__(self) -> None:
        self.length = 0

    def bind_inputs(self, n_new: int) -> dict[str, Any]:
        return {}

    def bind_outputs(self, n_new: int) -> dict[str, Any]:
        return {}

    def advance(self, n_new: int) -> None:
        self.length += n_new

    def rollback(self, length: int) -> None:
        """Keep the first `length` positions: a length update, no write."""
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback to {length}: the cache holds {self.length} positions")
        self.length = length

    def reset(self) -> None:
        self.length = 0

    def keep_rows(self, start: int, rows: np.ndarray) -> None:
        """Nothing is held: nothing moves."""


class ConcatKVCache:
    """KVCache for concat-style graphs (present = past + new) on host numpy buffers, allocated once."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, capacity: int, dtype: np.dtype) -> None:
        self.kv_heads, self.head_dim, self.capacity = kv_heads, head_dim, capacity
        self.past_names = names.kv_names(num_layers, "past")
        self.present_names = names.kv_names(num_layers, "present")
        # [ping-pong, tensor, H * capacity * D]: flat so that any [1, H, L, D] is a contiguous prefix
        self._buffers = np.zeros((2, 2 * num_layers, kv_heads * capacity * head_dim), dtype=dtype)
        self._current = 0  # which half holds the past
        self.length = 0    # L: positions held

    def bind_inputs(self, n_new: int) -> dict[str, np.ndarray]:
        """past_key_values.*: [1, H, L, D] views of the current half (the engine binds the all-ones mask)."""
        return {name: self._view(self._current, t, self.length) for t, name in enumerate(self.past_names)}

    def bind_outputs(self, n_new: int) -> dict[str, np.ndarray]:
        """present.*: [1, H, L + n_new, D] views of the other half."""
        end = self.length + n_new
        if end > self.capacity:
            raise ValueError(f"KV cache overflow: {end} positions > capacity {self.capacity}")
        return {name: self._view(1 - self._current, t, end) for t, name in enumerate(self.present_names)}

    def advance(self, n_new: int) -> None:
        """The graph wrote L + n_new positions into the other half: it becomes the past."""
        self._current = 1 - self._current
        self.length += n_new

    def rollback(self, length: int) -> None:
        """Keep the first `length` positions: a length update plus an in-place move of heads 1..H-1."""
        if length >= self.length:
            return
        half = self._buffers[self._current]
        row_bytes = self.head_dim * half.itemsize
        for t in range(len(half)):
            base = half[t].ctypes.data
            for h in range(1, self.kv_heads):  # head h moves from h*L*D to h*length*D; memmove allows overlap
                ctypes.memmove(base + h * length * row_bytes, base + h * self.length * row_bytes, length * row_bytes)
        self.length = length

    def reset(self) -> None:
        self.length = 0

    def keep_rows(self, start: int, rows: np.ndarray) -> None:
        """Rows start + rows[i] -> start + i in every tensor [1, H, L, D] (a gather: the source rows are read first)."""
        for t in range(self._buffers.shape[1]):
            view = self._view(self._current, t, self.length)  # [1, H, L, D]
            view[:, :, start : start + len(rows)] = view[:, :, start + rows]

    def _view(self, half: int, tensor: int, length: int) -> np.ndarray:
        flat = self._buffers[half, tensor, : self.kv_heads * length * self.head_dim]
        return flat.reshape(1, self.kv_heads, length, self.head_dim)
