"""kquant.py: ONNX Runtime's k-quant search, bit for bit, in slices and on threads."""

from __future__ import annotations

import numpy as np
import pytest
from onnxruntime.quantization.neural_compressor.weight_only import quant_tensor_k_quant_cpu

from specpack.quantize.kquant import kquant_blocks


def _weights() -> np.ndarray:
    """Rows of W^T [m, K]: heavy-tailed values, plus the blocks whose search takes its other branches."""
    rng = np.random.default_rng(0)
    x = (rng.standard_t(3, (48, 512)) * 0.02).astype(np.float32)
    x[1, :64] = 0.5                                    # constant blocks: rmin == rmax, NaN candidates
    x[2, 32:96] = 0.0
    x[3] = np.round(x[3] * 50) / 50                    # few distinct values: ties in the grid
    x[4, :32] = np.linspace(-1, 1, 32, dtype=np.float32)
    x[5, :32] = 1e-30                                  # subnormal scales
    return x


@pytest.mark.parametrize(("bits", "block", "threads", "slice_blocks"),
                         [(4, 32, 2, 100), (4, 32, 1, 4096), (4, 16, 2, 7), (8, 32, 2, 33)])
def test_the_same_numbers_as_onnx_runtime(bits: int, block: int, threads: int, slice_blocks: int) -> None:
    x = _weights()
    with np.errstate(all="ignore"):
        want = quant_tensor_k_quant_cpu(x, bits, block)
    got = kquant_blocks(x, bits, block, threads=threads, slice_blocks=slice_blocks)
    for name, a, b in zip(("q", "scale", "zero point"), want, got, strict=True):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), name
        assert np.array_equal(a, b, equal_nan=True), f"{name}: {np.sum(a != b)} of {a.size} differ"


def test_the_search_moves_most_blocks_off_the_min_max_grid() -> None:
    """What the test above compares is the search's outcome, not its starting grid: most blocks end elsewhere."""
    x = _weights()
    _, scale, _ = kquant_blocks(x, 4, 32)
    blocks = x.reshape(-1, 32)
    minmax = (blocks.max(axis=1) - blocks.min(axis=1)) / 15
    assert np.mean(~np.isclose(scale[:, 0], minmax, rtol=1e-6)) > 0.5
