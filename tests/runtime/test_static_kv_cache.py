"""StaticKVCache: the arrays it binds are allocated once, the mask carries the length, rollback writes nothing.
(Graphs run through it in tests/export/test_static_export.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from specpack import names
from specpack.errors import SpecpackError
from specpack.runtime.static_kv_cache import StaticKVCache

LAYERS, HEADS, DIM, MAX_LEN = 2, 3, 4, 16


def _cache(dtype: type = np.float32) -> StaticKVCache:
    return StaticKVCache(LAYERS, HEADS, DIM, MAX_LEN, dtype)


def _mask(cache: StaticKVCache, n_new: int) -> np.ndarray:
    return cache.bind_inputs(n_new)[names.ATTENTION_MASK]


def test_binds_the_same_buffers_every_run() -> None:
    cache = _cache()
    first_in, first_out = cache.bind_inputs(5), cache.bind_outputs(5)
    addresses = {name: a.ctypes.data for name, a in {**first_in, **first_out}.items()}
    assert set(first_in) == {names.ATTENTION_MASK, *names.kv_names(LAYERS, "past")}
    assert set(first_out) == set(names.kv_names(LAYERS, "present"))
    for layer in range(LAYERS):
        for kind in ("key", "value"):
            past, present = first_in[names.past_name(layer, kind)], first_out[names.present_name(layer, kind)]
            assert past is present and past.shape == (1, HEADS, MAX_LEN, DIM) and past.flags.c_contiguous
    assert first_in[names.ATTENTION_MASK].shape == (1, MAX_LEN)
    cache.advance(5)
    for n_new in (1, 4, 2):  # steps and verifies of other sizes, and a rollback between
        inputs, outputs = cache.bind_inputs(n_new), cache.bind_outputs(n_new)
        assert inputs is first_in and outputs is first_out
        assert {name: a.ctypes.data for name, a in {**inputs, **outputs}.items()} == addresses
        cache.advance(n_new)
        cache.rollback(cache.length - 1)


def test_mask_holds_the_valid_length() -> None:
    cache = _cache()
    assert _mask(cache, 6).tolist() == [[1] * 6 + [0] * 10]
    cache.advance(6)
    assert _mask(cache, 5).tolist() == [[1] * 11 + [0] * 5]  # a verify over 5 tokens after 6
    cache.advance(5)
    cache.rollback(8)  # 2 of 4 drafts accepted
    assert cache.length == 8
    assert _mask(cache, 1).tolist() == [[1] * 9 + [0] * 7]
    cache.advance(1)
    cache.reset()
    assert cache.length == 0 and _mask(cache, 3).tolist() == [[1] * 3 + [0] * 13]


def test_rollback_writes_nothing() -> None:
    cache = _cache(np.float16)
    inputs = cache.bind_inputs(10)
    buffers = [inputs[name] for name in names.kv_names(LAYERS, "past")]
    for i, buffer in enumerate(buffers):  # what a graph run would have written: rows [0, 10)
        buffer[:, :, :10] = i + 1
    cache.advance(10)
    before = [b.copy() for b in buffers] + [inputs[names.ATTENTION_MASK].copy()]
    for buffer in buffers:
        buffer.flags.writeable = False  # any write from here on raises
    inputs[names.ATTENTION_MASK].flags.writeable = False
    cache.rollback(4)
    cache.rollback(4)
    cache.rollback(0)
    after = [*buffers, inputs[names.ATTENTION_MASK]]
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert cache.length == 0


def test_misuse_is_refused() -> None:
    cache = _cache()
    with pytest.raises(SpecpackError, match="does not fit the static KV cache") as err:
        cache.bind_inputs(MAX_LEN + 1)
    assert "max_len 16" in str(err.value) and "--max-len" in str(err.value)
    cache.bind_inputs(MAX_LEN)
    cache.advance(MAX_LEN)
    with pytest.raises(SpecpackError, match="16 cached \\+ 1 new"):
        cache.bind_inputs(1)
    with pytest.raises(SpecpackError):
        cache.bind_inputs(0)
    with pytest.raises(ValueError, match="rollback to 17"):
        cache.rollback(MAX_LEN + 1)
    cache.rollback(3)
    cache.bind_inputs(2)
    with pytest.raises(ValueError, match="advance"):
        cache.advance(1)
