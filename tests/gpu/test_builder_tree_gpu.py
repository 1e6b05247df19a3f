"""The model builder's tree form (export/builder_tree.py) on ONNX Runtime's CUDA EP, fp16 (the builder's FP16 CUDA
graph of the tiny qwen2 target, head_dim 16). Marked `gpu`: skipped where the CUDA execution provider is missing.

CUDA's GroupQueryAttention with both position_ids and attention_bias: each tree row's logits equal the plain graph's
over its root path alone within FP16_TOL (the plain graph runs GQA's fused kernels, the tree form its unfused path
with the bias, so the last bits differ), and the same check fails without either input (tests/export/
test_builder_tree.py's mutations).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specpack.export.builder_tree import ATTENTION_BIAS_SLOT, POSITION_IDS_SLOT
from tests.export.test_builder_export import HEAD_DIM, needs_builder
from tests.export.test_builder_tree import Runner, _drop, tree_form, worst_tree_row

ort = pytest.importorskip("onnxruntime")
pytestmark = [pytest.mark.gpu, needs_builder,
              pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                                 reason="needs ONNX Runtime's CUDA execution provider and a GPU")]
# 4 fp16 ulps at the tiny model's logits (|logit| < 16: spacing 2^-7 from 8 on): two attention kernels (the fused
# one, the bias path) round differently in each of 3 layers. Was 1e-2, below 2 ulps there: an H200 measured 1.73e-2
# (2.2 ulps) on 2026-11-28 (bench/results/gpu_tests_h200_run_e.txt)
FP16_TOL = 4 * float(np.spacing(np.float16(8)))


@pytest.fixture(scope="module")
def plain(tiny_pairs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specpack.export.builder_export import build_plain_graph

    target = tiny_pairs("qwen2", head_dim=HEAD_DIM)[1]
    return build_plain_graph(target, tmp_path_factory.mktemp("builder-fp16") / "work", "fp16", "cuda")[0]


def test_tree_rows_on_cuda_equal_each_root_path_alone(plain: Path, tmp_path: Path) -> None:
    cuda = "CUDAExecutionProvider"
    worst = worst_tree_row(Runner(tree_form(plain, tmp_path / "tree"), cuda, np.float16),
                           Runner(plain, cuda, np.float16), exact_prefill=False)
    print(f"tree rows vs root paths alone, CUDA fp16: max |diff| {worst:.2e}")
    assert worst < FP16_TOL
    for slot in (POSITION_IDS_SLOT, ATTENTION_BIAS_SLOT):
        broken = worst_tree_row(Runner(tree_form(plain, tmp_path / f"m{slot}", _drop(slot)), cuda, np.float16),
                                Runner(plain, cuda, np.float16), exact_prefill=False)
        print(f"without GQA input {slot}: max |diff| {broken:.2e}")
        assert broken > max(10 * worst, FP16_TOL)  # an order of magnitude beyond the honest form's rounding
