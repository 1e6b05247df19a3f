"""Block-quantized weights in ONNX Runtime's MatMulNBits layout: one representation for every source.

A weight W [K, N] (a MatMul's right-hand side, or the transpose of an embedding table [V, H]) is cut into
blocks of `block_size` consecutive values along K; block j of output column n holds

    W[k, n] = (q[n, k] - zero_point[n, j]) * scale[n, j] - min[n, j]        j = k // block_size

q has `bits` bits (2, 4 or 8). `zero_point` is 2**(bits - 1) when absent (ONNX Runtime's default);
`min` is absent except for GGUF's scale-and-min formats (Q4_K, ...), whose `scale * q - min` no integer
zero point can express. Storage (MatMulNBits' inputs B, scales, zero_points):

    packed       uint8 [N, K/bs, bs*bits/8]   bits packed low bits first along K
    scales       fp32  [N, K/bs]
    zero_points  uint8 [N, ceil(K/bs * bits/8)]   packed like B (or None)
    mins         fp32  [N, K/bs]                  (or None)

GatherBlockQuantized reads the same bytes as an embedding table [V = N, H = K]: row v of the table is
column n = v of W, so one packed array serves the lm_head and a tied embedding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BITS = (2, 4, 8)


@dataclass(frozen=True)
class BlockQuant:
    bits: int
    block_size: int
    packed: np.ndarray                 # uint8 [N, K/bs, bs*bits/8]
    scales: np.ndarray                 # float32 [N, K/bs]
    zero_points: np.ndarray | None     # uint8 [N, ceil(K/bs*bits/8)]; None: 2**(bits-1)
    mins: np.ndarray | None = None     # float32 [N, K/bs]; None: no min term

    def __post_init__(self) -> None:
        n, blocks, blob = self.packed.shape
        if self.bits not in BITS or blob * 8 != self.block_size * self.bits:
            raise ValueError(f"packed shape {self.packed.shape} does not hold {self.bits}-bit blocks of {self.block_size}")
        if self.scales.shape != (n, blocks) or (self.mins is not None and self.mins.shape != (n, blocks)):
            raise ValueError(f"scales {self.scales.shape} / mins do not match [{n}, {blocks}]")

    @property
    def k(self) -> int:
        return self.packed.shape[1] * self.block_size

    @property
    def n(self) -> int:
        return self.packed.shape[0]

    @property
    def nbytes(self) -> int:
        parts = (self.packed, self.scales, self.zero_points, self.mins)
        return sum(p.nbytes for p in parts if p is not None)

    def values(self) -> np.ndarray:
        """q as uint8 [N, K/bs, bs]."""
        return unpack_bits(self.packed, self.bits)

    def zero_point_values(self) -> np.ndarray:
        """The zero points as uint8 [N, K/bs] (the default when absent)."""
        n, blocks = self.scales.shape
        if self.zero_points is None:
            return np.full((n, blocks), 2 ** (self.bits - 1), np.uint8)
        return unpack_bits(self.zero_points, self.bits).reshape(n, -1)[:, :blocks]

    def dequantize(self) -> np.ndarray:
        """W [K, N] as float32, computed the way the formula above reads (and GGUF's dequantizers compute)."""
        q = self.values().astype(np.float32) - self.zero_point_values()[..., None].astype(np.float32)  # [N, B, bs]
        w = q * self.scales[..., None]
        if self.mins is not None:
            w = w - self.mins[..., None]
        return np.ascontiguousarray(w.reshape(self.n, self.k).T)


def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """uint8 values < 2**bits along the last axis -> packed bytes, the first value in the lowest bits."""
    per = 8 // bits
    v = values.astype(np.uint8)
    pad = (-v.shape[-1]) % per
    if pad:
        v = np.concatenate([v, np.zeros((*v.shape[:-1], pad), np.uint8)], axis=-1)
    v = v.reshape(*v.shape[:-1], -1, per)
    out = np.zeros(v.shape[:-1], np.uint8)
    for i in range(per):
        out |= v[..., i] << np.uint8(bits * i)
    return out


def unpack_bits(packed: np.ndarray, bits: int) -> np.ndarray:
    """The inverse of pack_bits (with any padding kept): packed bytes -> uint8 values along the last axis."""
    per = 8 // bits
    mask = np.uint8(2**bits - 1)
    parts = [(packed >> np.uint8(bits * i)) & mask for i in range(per)]
    return np.stack(parts, axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * per)


def from_values(q: np.ndarray, scales: np.ndarray, bits: int, block_size: int, zero_points: np.ndarray | None = None,
                mins: np.ndarray | None = None) -> BlockQuant:
    """A BlockQuant from unpacked q [N, K] (uint8), scales [N, K/bs], zero points [N, K/bs] (or None)."""
    n, k = q.shape
    packed = pack_bits(q.reshape(n, k // block_size, block_size), bits)
    zp = None if zero_points is None else pack_bits(zero_points, bits)
    return BlockQuant(bits, block_size, packed, np.ascontiguousarray(scales, np.float32), zp,
                      None if mins is None else np.ascontiguousarray(mins, np.float32))


def quantize_rtn(weight: np.ndarray, bits: int, block_size: int, symmetric: bool) -> BlockQuant:
    """W [K, N] (fp32 or fp16) -> BlockQuant by round-to-nearest, with ONNX Runtime's own quantizer kernels
    (onnxruntime.quantization.matmul_nbits_quantizer, the ones MatMulNBitsQuantizer runs)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, DefaultWeightOnlyQuantizer

    k, _ = weight.shape
    if k % block_size:
        raise ValueError(f"K = {k} is not a multiple of the block size {block_size}")
    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=symmetric, bits=bits)
    packed, scales, zero_points = DefaultWeightOnlyQuantizer(config).qbits_block_quant(
        np.ascontiguousarray(weight, dtype=np.float32))
    return BlockQuant(bits, block_size, packed, scales.astype(np.float32), None if symmetric else zero_points)


def quantize_kquant(weight: np.ndarray, bits: int, block_size: int, rows_per_chunk: int = 4096) -> BlockQuant:
    """W [K, N] -> BlockQuant with ONNX Runtime's k-quant search (its matmul_nbits_quantizer's "k_quant"
    algorithm, llama.cpp's make_qkx2: per block, the scale and min minimizing an importance-weighted squared
    error), with uint8 zero points: kquant.py's copy of it, the same numbers on every core. Columns of W are done
    in chunks, to bound memory."""
    from specpack.quantize.kquant import kquant_blocks

    k, n = weight.shape
    if k % block_size:
        raise ValueError(f"K = {k} is not a multiple of the block size {block_size}")
    parts = []
    for start in range(0, n, rows_per_chunk):
        rows = np.ascontiguousarray(weight[:, start : start + rows_per_chunk].T, dtype=np.float32)  # [m, K]
        m = rows.shape[0]
        q, scale, zero = kquant_blocks(rows, bits, block_size)  # [m*K/bs, bs], [m*K/bs, 1] x 2
        parts.append(from_values(q.astype(np.uint8).reshape(m, k), scale.reshape(m, -1).astype(np.float32), bits,
                                 block_size, zero.reshape(m, -1).astype(np.uint8)))
    return BlockQuant(bits, block_size, np.concatenate([p.packed for p in parts]),
                      np.concatenate([p.scales for p in parts]),
                      np.concatenate([p.zero_points for p in parts if p.zero_points is not None]))
