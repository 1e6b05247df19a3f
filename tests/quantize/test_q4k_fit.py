"""q4k_fit.py: int4 blocks fit from a Q4_K tensor's own integers; the blocks it does not cover searched exactly as
kquant.py searches them; nothing when the values are not the tensor's."""

from __future__ import annotations

import numpy as np
import pytest

from specpack.quantize.gguf_blocks import decode_q4_k
from specpack.quantize.kquant import kquant_blocks
from specpack.quantize.q4k_fit import q4k_int4_blocks
from tests.quantize.gguf_fixture import k_quant_blocks

gguf = pytest.importorskip("gguf")
N, K = 12, 512


@pytest.fixture(scope="module")
def tensor() -> tuple[np.ndarray, np.ndarray]:
    """(raw Q4_K rows [N, K/256*144], their values [N, K]): random blocks, so some have a zero scale or a min
    off the 0..15 grid (the searched ones)."""
    raw = k_quant_blocks(np.random.default_rng(3), "Q4_K", N * K // 256, 0.1).reshape(N, -1)
    return raw, gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K).reshape(N, K)


def _covered(raw: np.ndarray) -> np.ndarray:
    """The blocks the fit covers: a positive scale, the min on the grid (0 <= min / scale <= 15)."""
    _, s, mn = decode_q4_k(raw.reshape(-1, 144))
    s, mn = s.reshape(-1), mn.reshape(-1)
    r = mn / np.where(s > 0, s, 1)
    return (s > 0) & (r >= 0) & (r <= 15)


def _weighted_error(rows: np.ndarray, q: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """Per block, the k-quant search's objective: sum (rms + |w|) * (scale * (q - z) - w)^2, in fp64."""
    w = rows.reshape(-1, 32).astype(np.float64)
    wt = np.sqrt(np.mean(w * w, axis=1, keepdims=True)) + np.abs(w)
    deq = (q.astype(np.float64) - zero.astype(np.float64)) * scale.astype(np.float64)
    return np.sum(wt * (deq - w) ** 2, axis=1)


def test_keeps_the_q4k_integers_and_fits_the_best_zero_point(tensor: tuple[np.ndarray, np.ndarray]) -> None:
    raw, rows = tensor
    fitted = q4k_int4_blocks(raw, rows)
    assert fitted is not None
    q, scale, zero, searched = fitted
    fit = _covered(raw)
    q4k = decode_q4_k(raw.reshape(-1, 144))[0].reshape(-1, 32)
    assert 0 < searched == np.sum(~fit) < len(q)  # both paths are taken
    assert np.array_equal(q[fit], q4k[fit]) and np.all(zero[fit] <= 15)
    error = _weighted_error(rows, q, scale, zero)
    w = rows.reshape(-1, 32).astype(np.float64)
    wt = np.sqrt(np.mean(w * w, axis=1, keepdims=True)) + np.abs(w)
    for z in range(16):  # no zero point, with its own best scale, beats the one chosen (fp32 scale: 1e-5)
        lz = q4k.astype(np.float64) - z
        den = np.sum(wt * lz * lz, axis=1)
        best = np.where(den > 0, np.sum(wt * w * w, axis=1) - np.sum(wt * w * lz, axis=1) ** 2 / np.where(den > 0, den, 1),
                        np.inf)
        assert np.all(error[fit] <= best[fit] * (1 + 1e-5) + 1e-12), z


def test_no_worse_than_the_search(tensor: tuple[np.ndarray, np.ndarray]) -> None:
    raw, rows = tensor
    fitted = q4k_int4_blocks(raw, rows)
    assert fitted is not None
    q, scale, zero, _ = fitted
    search = kquant_blocks(rows, 4, 32)
    assert _weighted_error(rows, q, scale, zero).sum() <= _weighted_error(rows, *search).sum()


def test_the_blocks_it_does_not_cover_are_the_search_bit_for_bit(tensor: tuple[np.ndarray, np.ndarray]) -> None:
    raw, rows = tensor
    fitted = q4k_int4_blocks(raw, rows)
    assert fitted is not None
    q, scale, zero, searched = fitted
    left = np.flatnonzero(~_covered(raw))
    assert 0 < left.size == searched
    sq, ss, sz = kquant_blocks(rows.reshape(-1, 32)[left], 4, 32)
    assert np.array_equal(q[left], sq.astype(np.uint8))
    assert np.array_equal(scale[left], ss.astype(np.float32)) and np.array_equal(zero[left], sz)


@pytest.mark.parametrize(("threads", "slice_rows"), [(1, 5), (2, 1)])
def test_slices_and_threads_give_the_same_blocks(tensor: tuple[np.ndarray, np.ndarray], threads: int,
                                                 slice_rows: int) -> None:
    raw, rows = tensor
    want, got = q4k_int4_blocks(raw, rows), q4k_int4_blocks(raw, rows, threads=threads, slice_rows=slice_rows)
    assert want is not None and got is not None
    for a, b in zip(want, got, strict=True):
        assert np.array_equal(a, b)


def test_values_that_are_not_the_tensors_give_none(tensor: tuple[np.ndarray, np.ndarray]) -> None:
    raw, rows = tensor
    other = rows.copy()
    other[N - 1, K - 1] = np.nextafter(other[N - 1, K - 1], np.float32(1))  # one value, one ulp
    assert q4k_int4_blocks(raw, other, slice_rows=5) is None
    assert q4k_int4_blocks(raw[:, :-144], rows) is None  # rows longer than the tensor's
