"""ONNX Runtime's k-quant search (`quant_tensor_k_quant_cpu`, llama.cpp's make_qkx2), the same numbers faster.

    kquant_blocks(rows [m, K] fp32, bits, block_size)  -> (q [m*K/bs, bs] fp64, scale [m*K/bs, 1] fp64,
                                                           zero point [m*K/bs, 1] uint8)

Bit for bit what `onnxruntime.quantization.neural_compressor.weight_only.quant_tensor_k_quant_cpu` returns
(tests/quantize/test_kquant.py compares the two on the edges its search has: constant blocks, NaN candidates,
ties, subnormal scales; the real pair's int4 pack came out byte for byte the same). Every block is searched on
its own, so the blocks are done in slices that fit the CPU's cache, each slice's arrays written in place, and
the slices spread over threads (numpy releases the GIL inside each operation). The same expressions in the same
order on the same dtypes, so the same roundings:

    per block: weights = rms + |x|; the scale and min of the 20 candidate grids (rmin, rmax stretched by
    (14 + 0.1 i) / 15) that give the least weighted squared error, starting from the plain min/max grid;
    `rmin` is the best min so far (ONNX Runtime's form: it moves the next candidate's grid too)

Its cost on the 1.5B target (1.54 G weights) is most of `--quantize-target int4`'s time; 1.8x less CPU than
ONNX Runtime's own (README.md, "Requirements, as measured").
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

SLICE_BLOCKS = 4096  # blocks a slice: 4096 x 32 fp32 = 512 KiB an array, a few arrays in L2/L3
NSTEP, RDELTA, RRMIN = 20, 0.1, -1  # ONNX Runtime's search grid


def kquant_blocks(rows: np.ndarray, bits: int, block_size: int, threads: int | None = None,
                  slice_blocks: int = SLICE_BLOCKS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`quant_tensor_k_quant_cpu(rows, bits, block_size)`'s three arrays, computed in slices of `slice_blocks`
    blocks on `threads` threads (default: the CPUs this process may use)."""
    data = np.ascontiguousarray(np.reshape(rows, (-1, block_size)), dtype=np.float32)
    nb = data.shape[0]
    q = np.empty((nb, block_size), np.float64)
    scale = np.empty((nb, 1), np.float64)
    zero = np.empty((nb, 1), np.uint8)
    starts = range(0, nb, slice_blocks)
    threads = max(1, min(threads or len(os.sched_getaffinity(0)), len(starts)))

    def run(start: int) -> None:
        end = min(start + slice_blocks, nb)
        q[start:end], scale[start:end], zero[start:end] = _search(data[start:end], bits, block_size)

    if threads == 1:
        for start in starts:
            run(start)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, starts))
    return q, scale, zero


def _search(data: np.ndarray, bits: int, group_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One slice of blocks [nb, group_size] fp32: quant_tensor_k_quant_cpu's body, its temporaries in place."""
    maxq, minq = 2**bits - 1, 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        sum_x2 = np.sum(data**2, axis=1, keepdims=True)
        av_x = np.sqrt(sum_x2 / group_size)
        weights = np.add(av_x, np.abs(data))
        rmin = np.min(data, axis=1, keepdims=True)
        rmax = np.max(data, axis=1, keepdims=True)
        sum_w = np.sum(weights, axis=1, keepdims=True)
        sum_x = np.sum(weights * data, axis=1, keepdims=True)
        iscale = np.ones(rmax.shape, dtype=data.dtype)
        mask = rmin != rmax
        iscale[mask] = (maxq - minq) / (rmax[mask] - rmin[mask])
        scale = 1 / iscale
        quant_data = np.clip(np.round(iscale * (data - rmin)), minq, maxq)
        diff = scale * quant_data + rmin - data
        best_mad = np.sum(weights * diff**2, axis=1, keepdims=True)
        span = rmax - rmin  # rmax never changes; rmin does, row by row, where a candidate wins
        centered = data - rmin
        new = np.empty_like(data)
        mul = np.empty_like(data)
        tmp = np.empty_like(data)
        for is_ in range(NSTEP):
            factor = np.array([RRMIN + RDELTA * is_ + maxq - minq]).astype(data.dtype)[0]
            iscale_new = np.where(mask, factor / span, np.float32(1)).astype(data.dtype)
            np.multiply(iscale_new, centered, out=new)
            np.round(new, out=new)
            np.clip(new, minq, maxq, out=new)
            np.multiply(weights, new, out=mul)
            sum_l = np.sum(mul, axis=1, keepdims=True)
            np.multiply(mul, new, out=tmp)
            sum_l2 = np.sum(tmp, axis=1, keepdims=True)
            np.multiply(mul, data, out=tmp)
            sum_xl = np.sum(tmp, axis=1, keepdims=True)
            d = np.subtract(sum_w * sum_l2, sum_l**2)
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / d
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d
            np.multiply(this_scale, new, out=tmp)
            np.add(tmp, this_min, out=tmp)
            np.subtract(tmp, data, out=tmp)
            np.multiply(tmp, tmp, out=tmp)
            np.multiply(weights, tmp, out=tmp)
            mad = np.sum(tmp, axis=1, keepdims=True)
            idx = np.where(mad < best_mad)[0]
            if idx.size:
                quant_data[idx, :] = new[idx, :]
                best_mad[idx] = mad[idx]
                scale[idx] = this_scale[idx]
                rmin[idx] = this_min[idx]
                centered[idx, :] = data[idx, :] - rmin[idx]
                span[idx] = rmax[idx] - rmin[idx]
                mask[idx] = rmin[idx] != rmax[idx]
        zero_point = np.clip(((-rmin) / scale).round(), 0, maxq).astype("uint8")
        scale64 = scale.astype(np.float64)
        q_weight = np.empty_like(data, dtype=scale64.dtype)
        np.divide(data, scale64, out=q_weight)
        np.add(q_weight, zero_point, out=q_weight)
        np.round(q_weight, out=q_weight)
        np.clip(q_weight, minq, maxq, out=q_weight)
    return q_weight, scale64, zero_point
