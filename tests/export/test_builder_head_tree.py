"""`spec-export --graphs builder --draft-head HEAD --max-tree-nodes 16`: head-drafted trees (EAGLE-2's dynamic trees)
over the model builder's target graph in the tree form with the features cache (export/builder_tree.py on top of
export/builder_features.py; tiny qwen2, head_dim 16, k 4).

The tests of tests/e2e/test_head_trees.py, run on this pack: a tree's rows are the chain's; greedy head trees of several
budgets and shapes give the target alone's tokens; the cuda backend's code (device="cpu") gives the cpu backend's
tokens; the chi-square against exact probabilities (slow) with its peeking mutation rejected. Not repeated here: the
features rows' compaction (kv_compact.onnx is the same graph for both forms, [1, 1, M, F] features; tested there on a
head that accepts siblings often enough to move rows, which this pair's seldom does).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from specpack.contract.manifest import Manifest
from specpack.runtime.pack import Pack
from specpack.runtime.state import TreeShape
from specpack.sampling import SamplingParams
from tests.e2e.test_head_trees import (  # noqa: F401  (collected here, on this module's fixture)
    SAMPLES,
    ShapedHeadDrafter,
    _head_tree_samples,
    dev,
    pack,
    test_a_drafter_peeking_at_the_uniforms_is_rejected,
    test_greedy_head_trees_equal_the_target_alone,
    test_greedy_tree_auto_n_and_off_equal_the_target_alone,
    test_the_cuda_backends_head_trees,
    test_tree_rows_are_the_chains_rows,
)
from tests.e2e.test_sampling_distribution import P_FAIL
from tests.export.test_builder_export import HEAD_DIM, needs_builder

pytestmark = needs_builder


@pytest.fixture(scope="module")
def head_tree_dirs(tiny_head_pack: Callable[..., tuple[Path, Path, Path]]) -> tuple[Path, Path, Path]:
    return tiny_head_pack("qwen2", kv_cache="static", head_dim=HEAD_DIM, graphs="builder", max_tree_nodes=16)


def test_the_manifest_records_a_builder_head_tree_pack(head_tree_dirs: tuple[Path, Path, Path]) -> None:
    manifest = Manifest.read(head_tree_dirs[0])
    graph = manifest.target.graph
    assert graph.exporter == "builder" and graph.positions == "internal" and graph.tree is not None
    assert manifest.head is not None and manifest.head.tree_width > 0


@pytest.mark.slow
@pytest.mark.parametrize("params", [SamplingParams(1.0, top_k=3), SamplingParams(0.7, top_k=5)], ids=str)
def test_sampled_builder_head_trees_keep_the_distribution(
        pack: Pack,  # noqa: F811  (the fixture imported above)
        head_tree_dirs: tuple[Path, Path, Path], params: SamplingParams) -> None:
    """test_head_trees' chi-square on this pack (its head_dim-16 pair's head accepts 19-20 of about 9,950 nodes here,
    0.2 %, where the torch pair's accepts 55-133: the guard below asks for acceptances, not that pair's count)."""
    p, samples = _head_tree_samples(pack, head_tree_dirs, params, SAMPLES,
                                    lambda logits, length: ShapedHeadDrafter(pack, TreeShape(3, 2)))
    print(f"builder head trees {params}: alpha={samples.alpha:.3f} accepted={samples.accepted} p={p:.4g}")
    assert samples.accepted >= 10  # acceptances happen: the accept path and the row moves are tested
    assert p > P_FAIL
