"""The concat-style cache: rollback keeps exactly the first L positions of every head."""

from __future__ import annotations

import numpy as np

from specpack.runtime.kv_cache import ConcatKVCache


def test_truncate_keeps_prefix_of_every_head() -> None:
    cache = ConcatKVCache(num_tensors=2, kv_heads=3, head_dim=5, max_len=16, dtype=np.dtype(np.float32))
    rng = np.random.default_rng(0)
    full = rng.normal(size=(2, 1, 3, 11, 5)).astype(np.float32)  # [tensor, 1, H, L+S, D]
    for t, view in enumerate(cache.present(11)):
        view[...] = full[t]
    cache.advance(11, keep=7)
    assert cache.length == 7
    for t, view in enumerate(cache.past()):
        np.testing.assert_array_equal(view, full[t][:, :, :7])
    cache.truncate(2)
    for t, view in enumerate(cache.past()):
        np.testing.assert_array_equal(view, full[t][:, :, :2])


def test_present_never_aliases_past() -> None:
    cache = ConcatKVCache(num_tensors=1, kv_heads=2, head_dim=4, max_len=8, dtype=np.dtype(np.float32))
    cache.advance(3, keep=3)
    past, present = cache.past()[0], cache.present(5)[0]
    assert not np.shares_memory(past, present)
