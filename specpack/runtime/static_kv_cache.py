"""Static KV cache on host buffers: present.* is bound onto past.*, the graph writes rows [L, L+S) in place.

For graphs of the static form (names.py, "Static KV cache form"; kv_cache "static" in the manifest):

    buffers  [2 * layers, 1, kv_heads, max_len, head_dim]   one per cache tensor, allocated once;
                                                             past.{i}.* and present.{i}.* are the same view
    mask     int64 [1, max_len]                              the static attention mask: ones at [0, length + S)

A run over S new tokens binds the same arrays every time (same shapes, same addresses: what CUDA graphs
need); only the mask's contents move. Rollback is a length update: it writes nothing (rows past the length
are never read, and the next run overwrites them). The mask catches up lazily in `bind_inputs`, touching
only the entries between the old and the new end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specpack import names
from specpack.errors import SpecpackError
from specpack.runtime.kv_cache import LengthCache


class StaticLengthCache(LengthCache):
    """The length bookkeeping of a static cache (the KVCache protocol of kv_cache.py), whatever holds its buffers.

    Subclasses build the bound dicts once and give `mask_host`, the [1, max_len] int64 mask edited in place;
    `_mask_changed(low, high)` is called after an edit (a device cache uploads it there)."""

    def __init__(self, max_len: int, inputs: dict[str, Any], outputs: dict[str, Any], mask_host: np.ndarray) -> None:
        super().__init__()
        self.max_len = max_len
        self._inputs, self._outputs = inputs, outputs  # built once: every run binds these very buffers
        self._mask_host = mask_host  # [1, max_len] ones at [0, _mask_end)
        self._mask_end = 0

    def bind_inputs(self, n_new: int) -> dict[str, Any]:
        """The mask (ones at [0, length + n_new)) and the past buffers. The same dict every call: don't edit it."""
        end = self.length + n_new
        if n_new < 1 or end > self.max_len:
            raise SpecpackError("the sequence does not fit the static KV cache",
                                expected=f"1 <= new tokens and cached + new <= max_len {self.max_len}",
                                found=f"{self.length} cached + {n_new} new",
                                hint="shorten the prompt or max_new_tokens, or export with a larger --max-len")
        if end != self._mask_end:
            low, high = sorted((self._mask_end, end))
            self._mask_host[0, low:high] = 1 if end > self._mask_end else 0
            self._mask_end = end
            self._mask_changed(low, high)
        return self._inputs

    def _mask_changed(self, low: int, high: int) -> None:
        """The host mask's entries [low, high) were edited (a host cache binds it directly: nothing to do)."""

    def keep_rows(self, start: int, rows: np.ndarray) -> None:
        """Where the buffers are not host arrays, the rows move by a graph (kv_compact, docs/trees.md): the subclass's
        (DeviceStaticKVCache runs it on the device)."""
        raise NotImplementedError(f"{type(self).__name__} cannot move cache rows after a tree verify")

    def bind_outputs(self, n_new: int) -> dict[str, Any]:
        """The present buffers: the past buffers themselves (the graph writes rows [length, length + n_new))."""
        return self._outputs

    def advance(self, n_new: int) -> None:
        """The graph ran over n_new tokens bound by `bind_inputs(n_new)`."""
        if self.length + n_new != self._mask_end:
            raise ValueError(f"advance({n_new}) after bind_inputs for {self._mask_end - self.length} new tokens")
        super().advance(n_new)


class StaticKVCache(StaticLengthCache):
    """One model's cache on host buffers: positions [0, length) are valid."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, max_len: int, dtype: np.dtype | type) -> None:
        # [tensor, 1, H, max_len, D]: key_0, value_0, key_1, ... each a contiguous [1, H, max_len, D]
        self._buffers = np.zeros((2 * num_layers, 1, kv_heads, max_len, head_dim), dtype=dtype)
        mask = np.zeros((1, max_len), np.int64)  # [1, max_len], bound as is
        views = list(self._buffers)  # [1, H, max_len, D] each; past.{i}.* and present.{i}.* are the same object
        past, present = names.kv_names(num_layers, "past"), names.kv_names(num_layers, "present")
        super().__init__(max_len, {names.ATTENTION_MASK: mask, **dict(zip(past, views, strict=True))},
                         dict(zip(present, views, strict=True)), mask)

    def keep_rows(self, start: int, rows: np.ndarray) -> None:
        """Rows start + rows[i] -> start + i in every tensor (a gather: the source rows are read first)."""
        self._buffers[:, :, :, start : start + len(rows)] = self._buffers[:, :, :, start + rows]
