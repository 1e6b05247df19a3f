"""The tree form of the model builder's graph (export/builder_tree.py), run on ONNX Runtime's CPU EP.

On the tiny qwen2 target (head_dim 16, fp32 CPU): after a prefill through the tree form (T = 0: the plain graph's
logits and cache, bit for bit), random trees with 0-2 uncached rows before the root: each row's logits equal the plain
builder graph's over that row's root path alone (the tree_verify tolerance, 1e-4); a chain is the plain graph's run
bit for bit. Mutations the same check kills: GroupQueryAttention's position_ids left out (the kernel then counts rows:
positions not by depth) and its attention_bias left out (every node sees every earlier node). A run that fills the
whole cache (the kernel's "first prompt": position_ids[0] only) gives the plain graph's logits for T = 0.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from specpack.export.builder_tree import ATTENTION_BIAS_SLOT, POSITION_IDS_SLOT, add_tree_form
from tests.export.test_builder_export import HEAD_DIM, needs_builder

MAX_LEN = 64
TOL = 1e-4  # tests/export/test_tree_verify.py's
Cache = dict[str, np.ndarray]


@pytest.fixture(scope="module")
def plain(tiny_pairs: Callable[..., tuple[Path, Path]], tiny_store) -> Path:
    """The tiny qwen2 target's builder graph (fp32, cpu), renamed to our contract, built once per code version."""
    from specpack.export.builder_export import build_plain_graph

    target = tiny_pairs("qwen2", head_dim=HEAD_DIM)[1]
    return tiny_store.get(("builder-plain", "qwen2", HEAD_DIM),
                          lambda root: build_plain_graph(target, root / "work", "fp32", "cpu")) / "work" / "model.onnx"


def tree_form(plain: Path, out: Path, mutate: Callable[[onnx.NodeProto], None] | None = None) -> Path:
    """A copy of `plain` in the tree form (16 nodes), each GroupQueryAttention node then `mutate`d."""
    out.mkdir(parents=True, exist_ok=True)
    for f in (plain, plain.with_name(plain.name + ".data")):
        shutil.copy(f, out / f.name)
    add_tree_form(out / plain.name, 16, 256)
    if mutate is not None:
        model = onnx.load(str(out / plain.name), load_external_data=False)
        for node in model.graph.node:
            if node.op_type == "GroupQueryAttention":
                mutate(node)
        onnx.save_model(model, str(out / plain.name))
    return out / plain.name


class Runner:
    """One graph over the static cache (host buffers; the CPU EP unless `provider` says): run(ids, L, cache, parents)
    -> (logits [S, V] fp32, new cache). `dtype`: the graph's io dtype."""

    def __init__(self, path: Path, provider: str = "CPUExecutionProvider", dtype: type = np.float32) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), options, providers=[provider, "CPUExecutionProvider"])
        self.past = [i for i in self.session.get_inputs() if i.name.startswith("past_key_values.")]
        self.dtype = dtype

    def empty(self) -> Cache:
        return {i.name: np.zeros((1, i.shape[1], MAX_LEN, HEAD_DIM), self.dtype) for i in self.past}

    def run(self, ids: list[int], start: int, cache: Cache, parents: list[int] | None = None
            ) -> tuple[np.ndarray, Cache]:
        feeds = {"input_ids": np.asarray([ids], np.int64),
                 "attention_mask": (np.arange(MAX_LEN) < start + len(ids)).astype(np.int64)[None],
                 **{name: buf.copy() for name, buf in cache.items()}}
        if parents is not None:
            feeds["parents"] = np.asarray(parents, np.int64).reshape(1, -1)
        names = [o.name for o in self.session.get_outputs()]
        out = dict(zip(names, self.session.run(None, feeds), strict=True))
        return out["logits"][0].astype(np.float32), {n: out[n.replace("past_key_values", "present")] for n in cache}


def random_trees(rng: np.random.Generator, vocab: int) -> list[tuple[list[int], list[int]]]:
    """(tokens, parents): a chain, a star, a deep tree and random trees of 1-16 nodes, topological."""
    shapes = [list(range(-1, 5)), [-1] * 5, [-1, 0, 1, 1, 3, 4, 4, 6]]
    for nodes in (1, 7, 12, 16):
        shapes.append([-1] + [int(rng.integers(-1, i)) for i in range(1, nodes)])
    return [(rng.integers(0, vocab, len(p)).tolist(), p) for p in shapes]


def root_path(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def worst_tree_row(tree: Runner, plain: Runner, seed: int = 0, exact_prefill: bool = True) -> float:
    """The largest |logit difference| between a tree row and the plain graph over its root path alone, over the
    random trees after a prefill (itself checked bit for bit with `exact_prefill`, else counted in)."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, 200, 9).tolist()
    want, want_cache = plain.run(prompt, 0, plain.empty())
    got, cache = tree.run(prompt, 0, tree.empty(), [])
    worst = float(np.abs(got - want).max())
    if exact_prefill:
        np.testing.assert_array_equal(got, want)
        for name in cache:
            np.testing.assert_array_equal(cache[name], want_cache[name])
    for before, (tokens, parents) in zip([0, 1, 2] * 3, random_trees(rng, 200), strict=False):
        start = len(prompt) - before  # the last `before` prompt rows are not cached yet, then the root
        lead = [*prompt[start:], int(rng.integers(0, 200))]
        logits, _ = tree.run(lead + tokens, start, cache, parents)
        alone, _ = plain.run(lead, start, cache)
        worst = max(worst, float(np.abs(logits[: len(lead)] - alone).max()))
        for node in range(len(tokens)):
            path = lead + [tokens[j] for j in root_path(parents, node)]
            alone, _ = plain.run(path, start, cache)
            worst = max(worst, float(np.abs(logits[len(lead) + node] - alone[-1]).max()))
    return worst


@needs_builder
def test_tree_rows_equal_each_root_path_alone(plain: Path, tmp_path: Path) -> None:
    runner = Runner(plain)
    assert worst_tree_row(Runner(tree_form(plain, tmp_path / "tree")), runner) < TOL


@needs_builder
def test_a_chain_and_a_full_cache_prefill_are_the_plain_graphs_run(plain: Path, tmp_path: Path) -> None:
    tree, runner = Runner(tree_form(plain, tmp_path / "tree")), Runner(plain)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, 200, 11).tolist()
    _, cache = runner.run(prompt, 0, runner.empty())
    for k in (0, 1, 4, 16):
        ids = rng.integers(0, 200, k + 1).tolist()
        got, got_cache = tree.run(ids, len(prompt), cache, list(range(-1, k - 1)))
        want, want_cache = runner.run(ids, len(prompt), cache)
        np.testing.assert_array_equal(got, want)
        for name in cache:
            np.testing.assert_array_equal(got_cache[name], want_cache[name])
    full = rng.integers(0, 200, MAX_LEN).tolist()  # GroupQueryAttention's first prompt: S == total_sequence_length
    np.testing.assert_array_equal(tree.run(full, 0, tree.empty(), [])[0], runner.run(full, 0, runner.empty())[0])


def _drop(slot: int) -> Callable[[onnx.NodeProto], None]:
    def mutate(node: onnx.NodeProto) -> None:
        node.input[slot] = ""

    return mutate


@needs_builder
@pytest.mark.parametrize("slot", [POSITION_IDS_SLOT, ATTENTION_BIAS_SLOT], ids=["positions-by-row", "bias-ignored"])
def test_the_check_kills_a_graph_without_positions_or_bias(plain: Path, tmp_path: Path, slot: int) -> None:
    assert worst_tree_row(Runner(tree_form(plain, tmp_path / "tree", _drop(slot))), Runner(plain)) > 100 * TOL


@needs_builder
def test_the_tree_form_reads_no_host_value_as_data(plain: Path, tmp_path: Path) -> None:
    from tests.graphs.host_values import host_values_in_data

    path = tree_form(plain, tmp_path / "tree")
    assert host_values_in_data(onnx.load(str(path), load_external_data=False)) == []
