"""GGUF blocks carried over exactly: each format's BlockQuant dequantizes to gguf's own values, bit for bit,
and ONNX Runtime's MatMulNBits reads the bytes as that weight."""

from __future__ import annotations

import numpy as np
import pytest

from specpack.quantize.gguf_blocks import FORMATS, exact_block_quant
from specpack.quantize.nbits import BlockQuant
from tests.quantize.gguf_fixture import k_quant_blocks
from tests.quantize.ort_helpers import matmul_nbits

gguf = pytest.importorskip("gguf")
N, K = 24, 512


def _raw(fmt: str, rng: np.random.Generator) -> np.ndarray:
    """uint8 [N, row bytes]: gguf's quantizer for the simple formats, random valid blocks for K-quants."""
    if fmt in ("Q4_K", "Q5_K", "Q6_K"):
        return k_quant_blocks(rng, fmt, N * K // 256, 0.1).reshape(N, -1)
    values = rng.standard_normal((N, K)).astype(np.float32) * 0.1
    return gguf.quants.quantize(values, gguf.GGMLQuantizationType[fmt])


def _reference(raw: np.ndarray, fmt: str) -> np.ndarray:
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[fmt]).reshape(N, K)  # [N, K]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_dequantizes_to_ggufs_values_exactly(fmt: str) -> None:
    raw = _raw(fmt, np.random.default_rng(sorted(FORMATS).index(fmt)))
    reference = _reference(raw, fmt)
    bq = exact_block_quant(raw, fmt, (N, K), reference=reference.T, rows_per_chunk=10)  # chunks of rows too
    assert isinstance(bq, BlockQuant), bq
    _, bits, block_size = FORMATS[fmt]
    assert (bq.bits, bq.block_size, bq.k, bq.n) == (bits, block_size, K, N)
    assert np.array_equal(bq.dequantize(), reference.T)  # W [K, N], bit for bit
    assert (bq.mins is not None) == (fmt == "Q4_K")  # scale-and-min: the one format with a min term


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_matmul_nbits_reads_the_blocks(fmt: str) -> None:
    """x @ W through ONNX Runtime (fp32 accuracy) with the carried-over bytes, mins subtracted as stage.py does."""
    rng = np.random.default_rng(7)
    raw = _raw(fmt, rng)
    bq = exact_block_quant(raw, fmt, (N, K))
    assert isinstance(bq, BlockQuant)
    x = rng.standard_normal((3, K)).astype(np.float32)
    y = matmul_nbits(x, bq, accuracy_level=0)
    if bq.mins is not None:  # x @ (W_q - M) = x @ W_q - blocksum(x) @ mins^T
        y = y - x.reshape(3, -1, bq.block_size).sum(-1) @ bq.mins.T
    want = x.astype(np.float64) @ _reference(raw, fmt).T.astype(np.float64)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_formats_without_an_exact_form_say_why() -> None:
    raw = _raw("Q5_K", np.random.default_rng(1))
    assert "no exact MatMulNBits form" in str(exact_block_quant(raw, "Q5_K", (N, K)))


def test_a_weight_that_is_not_the_tensor_is_refused() -> None:
    raw = _raw("Q8_0", np.random.default_rng(2))
    other = _reference(raw, "Q8_0").T.copy()
    other[5, 3] += 1.0
    assert "differs" in str(exact_block_quant(raw, "Q8_0", (N, K), reference=other))
