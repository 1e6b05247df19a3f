"""GGUF quantized tensors -> BlockQuant (nbits.py) without loss, where the block format maps onto MatMulNBits.

A GGUF weight of logical shape [N, K] stores each of its N rows as consecutive blocks along K, as
MatMulNBits does. The formats below keep their own integers and scales; each is checked against gguf's own
dequantizer, bit for bit, before it is used (`exact_block_quant` returns a reason string instead when
it does not match, and the caller falls back to dequantize + quantize):

    format  GGUF block                                   MatMulNBits            stored q        zero point
    Q8_0    32 x int8 q, fp16 d:        w = d*q          8-bit, block 32        q + 128         128 (default)
    Q4_0    32 x 4-bit q, fp16 d:       w = d*(q - 8)    4-bit, block 32        q               8 (default)
    Q5_0    32 x 5-bit q, fp16 d:       w = d*(q - 16)   8-bit, block 32        q + 112         128 (default)
    Q6_K    256 = 16 x 16, 6-bit q, int8 sc, fp16 d:
                                        w = d*sc*(q - 32)  8-bit, block 16      q + 96          128 (default)
    Q4_K    256 = 8 x 32, 4-bit q, 6-bit sc and m, fp16 d and dmin:
                                        w = d*sc*q - dmin*m  4-bit, block 32    q               0, min = dmin*m

Scales are fp32 products of the fp16 and integer fields, computed as gguf computes them, so the
dequantized values are identical. Q4_K's `- dmin*m` is a per-block min (BlockQuant.mins): no integer
zero point expresses it. Q6_K and Q5_0 have more than 4 bits, so they take 8-bit storage.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from specpack.quantize.nbits import BlockQuant, from_values

# Decoder: raw blocks uint8 [n_blocks, type_size] -> (q uint8 [n_blocks, QK], scales fp32 [n_blocks, QK/bs],
#          mins fp32 [n_blocks, QK/bs] or None); q in the stored (zero-point-shifted) domain
Decoded = tuple[np.ndarray, np.ndarray, np.ndarray | None]
QK_K = 256


def _fp16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)  # [n, 1]


def _decode_q8_0(blocks: np.ndarray) -> Decoded:
    d = _fp16(blocks[:, :2])                                             # [n, 1]
    q = blocks[:, 2:].view(np.int8).astype(np.int16) + 128               # [n, 32]
    return q.astype(np.uint8), d, None


def _nibbles(qs: np.ndarray, group: int) -> np.ndarray:
    """GGUF's nibble order: in each run of `group` bytes, the low nibbles come first, then the high ones."""
    n = qs.shape[0]
    qs = qs.reshape(n, -1, 1, group) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (qs & np.uint8(0x0F)).reshape(n, -1)


def _decode_q4_0(blocks: np.ndarray) -> Decoded:
    return _nibbles(blocks[:, 2:], 16), _fp16(blocks[:, :2]), None


def _decode_q5_0(blocks: np.ndarray) -> Decoded:
    d = _fp16(blocks[:, :2])
    qh = np.ascontiguousarray(blocks[:, 2:6]).view(np.uint32)            # [n, 1]
    high = ((qh >> np.arange(32, dtype=np.uint32)) & np.uint32(1)).astype(np.uint8)
    q = _nibbles(blocks[:, 6:], 16) | (high << np.uint8(4))              # [n, 32] in 0..31
    return q + np.uint8(112), d, None


def _decode_q6_k(blocks: np.ndarray) -> Decoded:
    n = blocks.shape[0]
    ql, qh = blocks[:, :128], blocks[:, 128:192]
    sc = blocks[:, 192:208].view(np.int8).astype(np.float32)             # [n, 16]
    d = _fp16(blocks[:, 208:210])                                        # [n, 1]
    low = _nibbles(ql, 64).reshape(n, -1, 32)                            # [n, 8, 32]
    high = qh.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    high = (high & np.uint8(3)).reshape(n, -1, 32)
    q = (low | (high << np.uint8(4))).reshape(n, QK_K)                   # 0..63
    return q + np.uint8(96), d * sc, None


def decode_q4_k(blocks: np.ndarray) -> Decoded:
    from gguf.quants import Q4_K

    d, dmin = _fp16(blocks[:, :2]), _fp16(blocks[:, 2:4])
    sc, m = Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))    # [n, 8] each
    q = _nibbles(blocks[:, 16:], 32)                                     # [n, 256]
    return q, d * sc.astype(np.float32), dmin * m.astype(np.float32)


# format name -> (decoder, bits, block size)
FORMATS: dict[str, tuple[Callable[[np.ndarray], Decoded], int, int]] = {
    "Q8_0": (_decode_q8_0, 8, 32),
    "Q4_0": (_decode_q4_0, 4, 32),
    "Q5_0": (_decode_q5_0, 8, 32),
    "Q6_K": (_decode_q6_k, 8, 16),
    "Q4_K": (decode_q4_k, 4, 32),
}


def exact_block_quant(raw: np.ndarray, type_name: str, shape: tuple[int, int], reference: np.ndarray | None = None,
                      rows_per_chunk: int = 8192) -> BlockQuant | str:
    """The GGUF tensor `raw` (uint8, its N rows of blocks) of logical shape [N, K] as a BlockQuant of W = its
    transpose [K, N], or why it cannot be carried over exactly. Each chunk of rows is checked against gguf's
    own dequantizer and, when given, against `reference` (W [K, N], e.g. the exported graph's weight)."""
    import gguf

    if type_name not in FORMATS:
        return f"{type_name} has no exact MatMulNBits form here"
    decode, bits, block_size = FORMATS[type_name]
    qtype = gguf.GGMLQuantizationType[type_name]
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n, k = shape
    if k % block:
        return f"K = {k} is not a multiple of the {type_name} block ({block})"
    rows = np.asarray(raw, np.uint8).reshape(n, -1)
    if rows.shape[1] != k // block * type_size:
        return f"{rows.shape[1]} bytes a row where a row of {k} {type_name} values takes {k // block * type_size}"
    parts = []
    for start in range(0, n, rows_per_chunk):
        blocks = np.ascontiguousarray(rows[start : start + rows_per_chunk]).reshape(-1, type_size)
        m = blocks.shape[0] * block // k  # rows in this chunk
        q, scales, mins = decode(blocks)
        zero = None if mins is None else np.zeros((m, k // block_size), np.uint8)
        part = from_values(q.reshape(m, k), scales.reshape(m, -1), bits, block_size, zero,
                           None if mins is None else mins.reshape(m, -1))
        ours = part.dequantize()  # [K, m]
        if not np.array_equal(ours.T, gguf.quants.dequantize(blocks, qtype).reshape(m, k)):
            return f"the {type_name} blocks did not decode to gguf's dequantized values"
        if reference is not None and not np.array_equal(ours, reference[:, start : start + m]):
            return "the graph's weight differs from the GGUF tensor's dequantized values"
        parts.append(part)
    return _concat(parts)


def _concat(parts: list[BlockQuant]) -> BlockQuant:
    """One BlockQuant from BlockQuants of consecutive row ranges (columns of W)."""
    first = parts[0]

    def cat(name: str) -> np.ndarray | None:
        arrays = [getattr(p, name) for p in parts]
        return None if arrays[0] is None else np.concatenate(arrays, axis=0)

    packed, scales = np.concatenate([p.packed for p in parts]), np.concatenate([p.scales for p in parts])
    return BlockQuant(first.bits, first.block_size, packed, scales, cat("zero_points"), cat("mins"))
