"""int4 blocks of a GGUF Q4_K tensor (MatMulNBits: an fp32 scale and a uint8 zero point a block), fit from its own
integers instead of searched.

    q4k_int4_blocks(raw [N, row bytes] uint8, rows [N, K] fp32) -> (q [N*K/32, 32] uint8, scale [N*K/32, 1] fp32,
                                                                     zero point [N*K/32, 1] uint8, searched) | None

Q4_K stores each block of 32 as w = s*q - mn (s = d*sc, mn = dmin*m, q in 0..15): a scale and a min, where
MatMulNBits has a scale and an integer zero point, w ~ s'*(q - z). The 4-bit q are kept; for z = floor(r) and
floor(r) + 1 (r = mn / s: the zero point that would give the min exactly, were it an integer), the scale of least
weighted squared error is closed-form,

    s'(z) = sum(wt*w*(q - z)) / sum(wt*(q - z)^2),   error(z) = sum(wt*w^2) - s'(z) * sum(wt*w*(q - z)),

with the k-quant search's weights wt = rms(block) + |w| (kquant.py), and the z of the smaller error is kept (no
other z in 0..15 does better: tests/quantize/test_q4k_fit.py). The
search (ONNX Runtime's k-quant, 20 candidate grids a block) finds Q4_K's own scale on such blocks and rounds
its min to a zero point; this fit has a lower error on the real 1.5B target (README.md, "Requirements, as
measured") at a small part of the cost. Blocks it does not cover (a zero or negative scale, r outside 0..15, a
fit that is not a positive finite scale) are searched by kquant_blocks (`searched` counts them). None when `rows`
are not the Q4_K tensor's values: the caller searches the whole tensor.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from specpack.quantize.gguf_blocks import QK_K, decode_q4_k
from specpack.quantize.kquant import kquant_blocks

BLOCK = 32
MAXQ = 15
Q4_K_BYTES = 144  # a super-block of 256 weights
SLICE_ROWS = 256  # rows of the tensor a slice: 256 x 1536 fp32 = 1.5 MiB an array

Fit = tuple[np.ndarray, np.ndarray, np.ndarray, int]


def q4k_int4_blocks(raw: np.ndarray, rows: np.ndarray, threads: int | None = None,
                    slice_rows: int = SLICE_ROWS) -> Fit | None:
    """The int4 blocks of the Q4_K tensor `raw` (its N rows of super-blocks) whose values are `rows` [N, K], or
    None if they are not its values. Slices of `slice_rows` rows on `threads` threads (default: this process's CPUs)."""
    n, k = rows.shape
    if k % QK_K or raw.shape != (n, k // QK_K * Q4_K_BYTES):
        return None
    nb = n * k // BLOCK
    q = np.empty((nb, BLOCK), np.uint8)
    scale = np.empty((nb, 1), np.float32)
    zero = np.empty((nb, 1), np.uint8)
    per_row = k // BLOCK
    starts = range(0, n, slice_rows)
    threads = max(1, min(threads or len(os.sched_getaffinity(0)), len(starts)))

    def run(start: int) -> int | None:
        end = min(start + slice_rows, n)
        part = slice(start * per_row, end * per_row)
        fitted = _fit(np.ascontiguousarray(raw[start:end]), np.asarray(rows[start:end], np.float32))
        if fitted is None:
            return None
        q[part], scale[part], zero[part], searched = fitted
        return searched

    if threads == 1:
        counts = [run(s) for s in starts]
    else:
        with ThreadPoolExecutor(threads) as pool:
            counts = list(pool.map(run, starts))
    if any(c is None for c in counts):
        return None
    return q, scale, zero, sum(c or 0 for c in counts)


def _fit(raw: np.ndarray, rows: np.ndarray) -> Fit | None:
    """One slice: (q, scale, zero point, blocks searched), or None if `rows` differ from the Q4_K values."""
    q, s, mins = decode_q4_k(raw.reshape(-1, Q4_K_BYTES))        # [n, 256] uint8, [n, 8] fp32 x 2
    assert mins is not None  # Q4_K always has its min term
    mn = mins.reshape(-1, 1)
    q = np.ascontiguousarray(q.reshape(-1, BLOCK))
    s = s.reshape(-1, 1)
    w = rows.reshape(-1, BLOCK)
    qf = q.astype(np.float32)
    if not np.array_equal(qf * s - mn, w):  # gguf's own dequantization, operation for operation (gguf_blocks.py)
        return None
    wt = np.sqrt(np.mean(w * w, axis=1, keepdims=True))
    wt = wt + np.abs(w)
    ww = wt * w
    sums = [np.sum(x, axis=1, dtype=np.float64) for x in (ww, ww * qf, wt, wt * qf, wt * qf * qf)]
    b, a, e, d, c = sums  # sum wt*w, sum wt*w*q, sum wt, sum wt*q, sum wt*q^2
    with np.errstate(divide="ignore", invalid="ignore"):
        r = mn[:, 0].astype(np.float64) / s[:, 0]
        z0 = np.floor(r)
        best_z, best_scale, best_gain = z0, np.full_like(r, np.nan), np.full_like(r, -np.inf)
        for z in (z0, z0 + 1):
            num, den = a - z * b, c - 2 * z * d + z * z * e
            gain = np.where((den > 0) & (z <= MAXQ), num * num / den, -np.inf)  # error = sum(wt*w^2) - gain
            better = gain > best_gain
            best_z = np.where(better, z, best_z)
            best_scale = np.where(better, num / den, best_scale)
            best_gain = np.where(better, gain, best_gain)
        scale = best_scale.astype(np.float32)
        searched = ~((s[:, 0] > 0) & (r >= 0) & (r <= MAXQ) & np.isfinite(scale) & (scale > 0))
    zero = np.where(searched, 0, best_z).astype(np.uint8)[:, None]
    scale = scale[:, None]
    left = np.flatnonzero(searched)
    if left.size:
        sq, ss, sz = kquant_blocks(w[left], 4, BLOCK, threads=1)
        q[left], scale[left], zero[left] = sq.astype(np.uint8), ss.astype(np.float32), sz
    return q, scale, zero, int(left.size)
