"""Concat-style KV cache on host buffers: present = past + new, rollback = keep the first L positions.

Each cache tensor lives in two flat buffers (ping-pong): the graph reads past [1, H, L, D] from one and
writes present [1, H, L+S, D] into the other, never onto its own input (ONNX Runtime does not refuse
that aliasing and silently corrupts the cache). Keeping the first `keep` < L+S positions of a
[1, H, L+S, D] tensor moves heads 1..H-1 down in place (head 0 is already where it belongs).
"""

from __future__ import annotations

import ctypes

import numpy as np


class ConcatKVCache:
    def __init__(self, num_tensors: int, kv_heads: int, head_dim: int, max_len: int, dtype: np.dtype) -> None:
        self.num_tensors, self.kv_heads, self.head_dim, self.max_len = num_tensors, kv_heads, head_dim, max_len
        # [ping-pong, tensor, H * max_len * D]: flat so that any [1, H, L, D] is a contiguous prefix
        self._buffers = np.zeros((2, num_tensors, kv_heads * max_len * head_dim), dtype=dtype)
        self._current = 0  # which half holds the past
        self.length = 0    # L: positions held

    def past(self) -> list[np.ndarray]:
        """[1, H, L, D] views of the current cache, one per tensor."""
        return [self._view(self._current, t, self.length) for t in range(self.num_tensors)]

    def present(self, new_length: int) -> list[np.ndarray]:
        """[1, H, new_length, D] views of the other half, where the graph writes present."""
        return [self._view(1 - self._current, t, new_length) for t in range(self.num_tensors)]

    def advance(self, new_length: int, keep: int) -> None:
        """The graph wrote `new_length` positions into the other half: make it current, keeping `keep`."""
        self._current = 1 - self._current
        self.length = new_length
        self.truncate(keep)

    def truncate(self, keep: int) -> None:
        """Roll back to the first `keep` positions (a length update plus an in-place move of heads 1..H-1)."""
        if keep >= self.length:
            return
        half = self._buffers[self._current]
        row_bytes = self.head_dim * half.itemsize
        for t in range(self.num_tensors):
            base = half[t].ctypes.data
            for h in range(1, self.kv_heads):  # head h moves from h*L*D to h*keep*D; memmove allows overlap
                ctypes.memmove(base + h * keep * row_bytes, base + h * self.length * row_bytes, keep * row_bytes)
        self.length = keep

    def reset(self) -> None:
        self.length = 0

    def _view(self, half: int, tensor: int, length: int) -> np.ndarray:
        flat = self._buffers[half, tensor, : self.kv_heads * length * self.head_dim]
        return flat.reshape(1, self.kv_heads, length, self.head_dim)
