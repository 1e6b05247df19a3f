"""BlockQuant: bit packing, ONNX Runtime's quantizer, and what MatMulNBits / GatherBlockQuantized compute from it."""

from __future__ import annotations

import numpy as np
import pytest

from specpack.quantize.nbits import pack_bits, quantize_rtn, unpack_bits
from tests.quantize.ort_helpers import gather_block_quantized, matmul_nbits


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_unpack_round_trip(bits: int) -> None:
    values = np.random.default_rng(bits).integers(0, 2**bits, (5, 3, 32), dtype=np.uint8)
    packed = pack_bits(values, bits)
    assert packed.shape == (5, 3, 32 * bits // 8)
    assert np.array_equal(unpack_bits(packed, bits), values)


def test_first_value_in_the_low_bits() -> None:
    assert pack_bits(np.array([[1, 2]], np.uint8), 4).tolist() == [[0x21]]


@pytest.mark.parametrize(("bits", "symmetric", "block"), [(4, False, 32), (4, True, 16), (8, True, 32), (8, False, 16)])
def test_rtn_matches_what_ort_computes(bits: int, symmetric: bool, block: int) -> None:
    """MatMulNBits (fp32 accuracy) computes x @ dequantize(). Rounding error: at most half a step, or one step for
    symmetric blocks (ONNX Runtime's scale = -absmax / 2**(bits-1) clips the other extreme to 2**(bits-1) - 1)."""
    rng = np.random.default_rng(bits + block)
    w = rng.standard_normal((128, 40)).astype(np.float32)  # [K, N]
    bq = quantize_rtn(w, bits, block, symmetric)
    assert (bq.k, bq.n, bq.bits, bq.block_size) == (128, 40, bits, block)
    assert (bq.zero_points is None) == symmetric
    deq = bq.dequantize()
    step = np.abs(np.repeat(bq.scales.T, block, axis=0))  # [K, N]: each weight's block step
    assert np.all(np.abs(deq - w) <= (1.0 if symmetric else 0.5) * step + 1e-6)
    x = rng.standard_normal((3, 128)).astype(np.float32)
    np.testing.assert_allclose(matmul_nbits(x, bq), x @ deq, rtol=1e-5, atol=1e-4)
    # int8 activations (accuracy level 4, the fast kernels): close, not equal
    np.testing.assert_allclose(matmul_nbits(x, bq, accuracy_level=4), x @ deq, rtol=0.05, atol=0.05 * np.abs(x @ deq).max())


@pytest.mark.parametrize("bits", [4, 8])
def test_gather_reads_the_same_bytes_as_the_matmul(bits: int) -> None:
    """An embedding table E [V, H] quantized as W = E^T: GatherBlockQuantized's rows are W's columns."""
    rng = np.random.default_rng(bits)
    table = rng.standard_normal((50, 64)).astype(np.float32)  # [V, H]
    bq = quantize_rtn(table.T, bits, 32, symmetric=False)
    ids = np.array([[0, 7, 49, 7]], np.int64)
    assert np.array_equal(gather_block_quantized(ids, bq), bq.dequantize().T[ids])


def test_kquant_matches_what_ort_computes() -> None:
    """ONNX Runtime's k-quant search: uint8 zero points, within a step of the weights, read as is by MatMulNBits."""
    from specpack.quantize.nbits import quantize_kquant

    rng = np.random.default_rng(3)
    w = rng.standard_normal((96, 30)).astype(np.float32)
    w[:, 3] = 0.5  # a constant column: its blocks have no range
    bq = quantize_kquant(w, 4, 32, rows_per_chunk=7)
    assert bq.zero_points is not None and (bq.k, bq.n) == (96, 30)
    deq = bq.dequantize()
    assert np.all(np.abs(deq - w) <= np.abs(np.repeat(bq.scales.T, 32, axis=0)) + 1e-6)
    x = rng.standard_normal((2, 96)).astype(np.float32)
    np.testing.assert_allclose(matmul_nbits(x, bq), x @ deq, rtol=1e-5, atol=1e-4)
