"""The concat-style cache through the KVCache interface: rollback keeps exactly the first L positions of every head."""

from __future__ import annotations

import numpy as np
import pytest

from specpack.runtime.kv_cache import ConcatKVCache, KVCache


def _cache(num_layers: int = 1, kv_heads: int = 3, head_dim: int = 5, capacity: int = 16) -> ConcatKVCache:
    return ConcatKVCache(num_layers, kv_heads, head_dim, capacity, np.dtype(np.float32))


def test_names_and_shapes() -> None:
    cache: KVCache = _cache(num_layers=2)
    past = cache.bind_inputs(4)
    present = cache.bind_outputs(4)
    assert list(past) == ["past_key_values.0.key", "past_key_values.0.value", "past_key_values.1.key",
                          "past_key_values.1.value"]
    assert list(present) == ["present.0.key", "present.0.value", "present.1.key", "present.1.value"]
    assert all(v.shape == (1, 3, 0, 5) for v in past.values()) and all(v.shape == (1, 3, 4, 5) for v in present.values())


def test_rollback_keeps_prefix_of_every_head() -> None:
    cache = _cache()
    rng = np.random.default_rng(0)
    full = rng.normal(size=(2, 1, 3, 11, 5)).astype(np.float32)  # [tensor, 1, H, L+S, D]
    for t, view in enumerate(cache.bind_outputs(11).values()):
        view[...] = full[t]
    cache.advance(11)
    assert cache.length == 11
    cache.rollback(7)
    assert cache.length == 7
    for t, view in enumerate(cache.bind_inputs(1).values()):
        np.testing.assert_array_equal(view, full[t][:, :, :7])
    cache.rollback(2)
    for t, view in enumerate(cache.bind_inputs(1).values()):
        np.testing.assert_array_equal(view, full[t][:, :, :2])
    # the next run writes past + new into the other half: the kept prefix comes along (the graph copies it)
    assert all(v.shape == (1, 3, 5, 5) for v in cache.bind_outputs(3).values())
    cache.reset()
    assert cache.length == 0


def test_present_never_aliases_past() -> None:
    cache = _cache(kv_heads=2, head_dim=4, capacity=8)
    cache.advance(3)
    past, present = cache.bind_inputs(2)["past_key_values.0.key"], cache.bind_outputs(2)["present.0.key"]
    assert not np.shares_memory(past, present)


def test_overflow_is_refused() -> None:
    cache = _cache(capacity=8)
    cache.advance(6)
    with pytest.raises(ValueError, match="capacity 8"):
        cache.bind_outputs(3)
