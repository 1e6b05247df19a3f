"""Token trees drafted by the draft model (EAGLE-2's dynamic trees: docs/trees.md, "Trees drafted by the draft model")
on the tiny tree pack of tests/e2e/test_tree_runtime.py (`spec-export --kv-cache static --max-tree-nodes 16`, k 4: its
draft model in the tree form), cpu backend and the cuda backend's code on the CPU EP.

- the pack: the draft's tree form (draft_positions, draft_mask in; tree_tokens, tree_logprobs out; `tree_width` 8),
  refused where broken;
- a tree's rows are the chain's: every tree run's top-K (tokens exactly, log-probabilities to 1e-5) equals that of the
  draft of a second backend run as a chain from an empty cache over the committed tokens and the node's root path, at
  every step of a generation (so the drafting backend's cache holds only committed rows after each verify: the tree's
  rows are dropped by the rollback, the accepted path fed again; `slow`: after accepted paths, with a draft that
  agrees with the target);
- greedy: the target alone's tokens with model trees of several node budgets, widths and depths, tree auto / N / off,
  a greedy width-1 tree within k_max drafted as a chain, on both backends (and the cuda backend's sampled tokens equal
  the cpu backend's);
- sampling: the chi-square of test_sampling_distribution.py with model-drafted trees against exact probabilities, and
  the same test rejects a drafter whose tree peeks at the verify's uniforms (tests/mutations.py, PeekingTrees); steps
  that mix sampled chains and trees (tree auto's "chains first") on both backends (the cuda backend's `slow`), each
  rejecting a tree's accepted rows left unmoved.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import specpack
from specpack import names
from specpack.runtime.drafter import Drafter, ModelDrafter
from specpack.runtime.engine import HeadTreeRun, TopRows
from specpack.runtime.k_policy import KPolicy
from specpack.runtime.pack import Pack
from specpack.runtime.state import DecodeState, Proposal, TreeShape, TreeStep
from specpack.runtime.static_kv_cache import StaticKVCache
from specpack.runtime.tree_policy import FixedTree
from specpack.sampling import SamplingParams
from tests.e2e.test_sampling_distribution import P_FAIL, TargetLogits, draw_samples, partitions, pvalue
from tests.mutations import PeekingTrees

PROMPT = "def add(a, b):"
SAMPLES = 1_000


@pytest.fixture(scope="module")
def tree_pack_dir(tiny_export: Callable[..., Path]) -> Path:
    return tiny_export("qwen2", "small", k=4, max_len=64, kv_cache="static", max_tree_nodes=16)


@pytest.fixture(scope="module")
def pack(tree_pack_dir: Path) -> Iterator[Pack]:
    loaded = specpack.load(tree_pack_dir, threads=1)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def dev(tree_pack_dir: Path) -> Iterator[Pack]:
    """The cuda backend's code on the CPU EP (tests/runtime/test_cuda_backend.py's device_pack)."""
    from tests.runtime.test_cuda_backend import device_pack

    loaded = device_pack(tree_pack_dir)
    yield loaded
    loaded.close()


class ShapedModelDrafter(ModelDrafter):
    """The pack's draft model drafting trees of one shape (width, depth) every step, whatever the policy set."""

    def __init__(self, pack: Pack, shape: TreeShape, chain_max: int = 0) -> None:
        super().__init__(pack.backend.draft, chain_max)
        self.shape = shape
        self.trees = self.steps = 0

    def propose(self, state: DecodeState, k: int) -> Proposal:
        state.tree = self.shape
        proposal = super().propose(state, k)
        self.trees += proposal.parents is not None
        self.steps += 1
        return proposal


def _with(pack: Pack, drafter: Drafter) -> Pack:
    return Pack(pack.path, pack.manifest, pack.tokenizer, pack.backend, drafter)


def test_the_model_tree_pack(pack: Pack) -> None:
    m = pack.manifest
    assert m.draft.tree_width == 8 and m.target.tree_width == 0 and m.target.graph.tree is not None
    assert {names.DRAFT_POSITIONS, names.DRAFT_MASK} <= {s.name for s in m.draft.graph.inputs}
    assert {names.TREE_TOKENS, names.TREE_LOGPROBS} <= {s.name for s in m.draft.graph.outputs}
    assert pack.trees_for("model", "auto") and not pack.trees_for("model", "off")


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d["draft"].update(tree_width=0), "does not feed"),  # the tree form's inputs, no tree_width
    (lambda d: d["draft"]["graph"]["inputs"].pop(4), "tree form"),  # tree_width without draft_mask
    (lambda d: d["target"]["graph"].pop("tree"), "verifies no trees"),  # a tree draft on a chain target
    (lambda d: d["target"].update(tree_width=8), "tree_width 8"),  # the tree form on the target's graph
])
def test_the_manifest_refuses_a_broken_model_tree_pack(tree_pack_dir: Path, mutate: Callable[[dict[str, Any]], object],
                                                       message: str) -> None:
    from specpack.contract.manifest import parse_manifest
    from specpack.errors import SpecpackError

    data = json.loads((tree_pack_dir / "manifest.json").read_text())
    parse_manifest(json.dumps(data).encode())
    assert data["draft"]["graph"]["inputs"][4]["name"] == names.DRAFT_MASK
    older = json.loads(json.dumps(data))
    del older["target"]["tree_width"]  # a manifest written before the field: 0, chains
    assert parse_manifest(json.dumps(older).encode()).target.tree_width == 0
    mutate(data)
    with pytest.raises(SpecpackError, match=message):
        parse_manifest(json.dumps(data).encode())


class ChainCheckingDrafter(ShapedModelDrafter):
    """Drafts model trees and, before returning each, checks every tree run's top-K (the catch-up's: the root's
    children; an expansion's: each node's) against the draft model of a second backend over the same pack (`reference`),
    run as a chain from an empty cache over the committed tokens and the node's root path. The drafting backend's cache
    is left as its tree runs left it, so what is checked is also what the rollback after each verify kept (the accepted
    path fed again by the next catch-up), not only the tree runs' positions and masks."""

    def __init__(self, pack: Pack, shape: TreeShape, reference: Pack) -> None:
        super().__init__(pack, shape)
        self.reference: Any = reference.backend.draft()
        self.checked = 0

    def propose(self, state: DecodeState, k: int) -> Proposal:
        model: Any = self.model()
        runs: list[tuple[HeadTreeRun | None, TopRows]] = []
        real = model.tree_step

        def spy(st: DecodeState, run: HeadTreeRun | None) -> TopRows:
            top = real(st, run)
            runs.append((run, top))
            return top

        model.tree_step = spy
        try:
            proposal = super().propose(state, k)
        finally:
            del model.tree_step
        saved, start = proposal.tokens.copy(), state.length
        token_at: dict[int, int] = {}  # draft cache row -> the token of the node it expanded
        for run, top in runs:
            if run is None:  # the catch-up: its last row's top-K are the root's children
                self._check(state, [], top, 0)
                continue
            assert run.committed == start and run.position == start + len(run.ancestors[0])  # root's + depth
            for j, token in enumerate(run.tokens.tolist()):
                token_at[int(top.rows[j])] = token
                self._check(state, [token_at[int(row)] for row in run.ancestors[j]] + [token], top, j)
        state.ids[start : start + len(saved)] = saved
        return proposal

    def _check(self, state: DecodeState, path: list[int], top: TopRows, row: int) -> None:
        """The reference draft's top-K after the committed tokens and `path` (a chain from an empty cache: its last
        row's top-K in run 0 of its tree buffers) against row `row` of a tree run's."""
        start, ref = state.length, self.reference
        ref.rollback(state, 0)
        state.ids[start : start + len(path)] = path
        ref.step(state, start + len(path), 0)
        tree = ref.engine.tree
        assert np.array_equal(tree.tokens[state.slot][0, 0], top.tokens[row]), (path, top.tokens[row])
        np.testing.assert_allclose(tree.logprobs[state.slot][0, 0], top.logprobs[row], atol=1e-5, rtol=0)
        self.checked += 1


def test_tree_rows_are_the_chains_rows(pack: Pack, tree_pack_dir: Path) -> None:
    with specpack.load(tree_pack_dir, threads=1) as reference:
        drafter = ChainCheckingDrafter(pack, TreeShape(3, 4), reference)
        out = _with(pack, drafter).generate(PROMPT, 12, tree=12)
    print(f"checked {drafter.checked} tree rows")
    assert out.stats["tree"] and drafter.checked >= 20, drafter.checked
    assert out.tokens == pack.generate(PROMPT, 12, k=0).tokens


@pytest.mark.slow  # a second tiny tree pack (the noisy draft, which agrees with the target: about 25 s to build)
def test_tree_rows_after_accepted_paths(tiny_export: Callable[..., Path]) -> None:
    """With a draft that agrees with the target (tiny.py's noisy copy), greedy trees accept paths of several nodes: the
    rows check above at every step after them (the draft's cache rolled back to the committed rows, the accepted path
    fed again by the catch-up), and the target alone's tokens on both backends."""
    from tests.runtime.test_cuda_backend import device_pack

    pack_dir = tiny_export("qwen2", "noisy", k=4, max_len=64, kv_cache="static", max_tree_nodes=16)
    with specpack.load(pack_dir, threads=1) as noisy, specpack.load(pack_dir, threads=1) as reference:
        want = noisy.generate(PROMPT, 32, k=0).tokens
        drafter = ChainCheckingDrafter(noisy, TreeShape(3, 4), reference)
        out = _with(noisy, drafter).generate(PROMPT, 32, tree=12)
        print(f"checked {drafter.checked} tree rows, accepted {out.stats['accepted']}")
        assert out.tokens == want and out.stats["accepted"] >= 8 and drafter.checked >= 40
        dev = device_pack(pack_dir)
        try:
            for tree in ("auto", 4, 16):
                got = dev.generate(PROMPT, 32, drafter="model", tree=tree)
                assert got.tokens == want and got.stats["accepted"] > 0, tree
        finally:
            dev.close()


@pytest.mark.parametrize(("nodes", "width", "depth"), [(1, 1, 1), (4, 2, 2), (8, 4, 3), (16, 8, 2), (16, 2, 8),
                                                       (12, 3, 12)])
def test_greedy_model_trees_equal_the_target_alone(pack: Pack, nodes: int, width: int, depth: int) -> None:
    shaped = _with(pack, ShapedModelDrafter(pack, TreeShape(width, depth)))
    for prompt in (PROMPT, [5]):
        want = pack.generate(prompt, 24, k=0).tokens
        got = shaped.generate(prompt, 24, tree=nodes)
        assert got.tokens == want and got.stats["tree"], (prompt, nodes, width, depth)


def test_greedy_tree_auto_n_and_off_equal_the_target_alone(pack: Pack) -> None:
    want = pack.generate(PROMPT, 32, k=0).tokens
    for tree in ("auto", 2, 8, 16, "off"):
        got = pack.generate(PROMPT, 32, drafter="model", tree=tree)
        assert got.tokens == want and got.stats["tree"] == (tree != "off"), tree
    assert pack.generate(PROMPT, 32, drafter="model", k=3).tokens == want  # a fixed k: trees of k nodes


def test_a_greedy_width_one_tree_is_drafted_as_a_chain(pack: Pack) -> None:
    """A greedy request's tree of width 1 within the chain's range goes the chain's way (no tree runs), the target
    alone's tokens; past the chain's range, without a chain range, or sampling, it stays a tree."""
    k_max = pack.manifest.k_max
    want = pack.generate(PROMPT, 24, k=0).tokens
    for nodes, chain_max, chains in ((k_max, k_max, True), (k_max + 2, k_max, False), (k_max, 0, False)):
        drafter = ShapedModelDrafter(pack, TreeShape(1, nodes), chain_max)
        got = _with(pack, drafter).generate(PROMPT, 24, tree=nodes)
        assert got.tokens == want, (nodes, chain_max)
        assert drafter.steps > 0 and (drafter.trees == 0) == chains, (nodes, chain_max, drafter.trees, drafter.steps)
    drafter = ShapedModelDrafter(pack, TreeShape(1, k_max), k_max)
    _with(pack, drafter).generate(PROMPT, 24, tree=k_max, temperature=0.8, seed=3)
    assert drafter.trees == drafter.steps > 0  # sampling: the tree's deterministic candidates


def test_the_cuda_backends_model_trees(pack: Pack, dev: Pack) -> None:
    """Greedy: the target alone's tokens through the device draft's trees (uploaded positions and masks, top-K read
    back); chains through the tree form; sampling: the cpu backend's tokens for the same seed."""
    want = pack.generate(PROMPT, 24, k=0).tokens
    for nodes, width, depth in ((4, 2, 2), (16, 8, 2), (12, 3, 12)):
        shaped = _with(dev, ShapedModelDrafter(dev, TreeShape(width, depth)))
        got = shaped.generate(PROMPT, 24, tree=nodes)
        assert got.tokens == want and got.stats["tree"], nodes
    for k in (1, 4):
        assert dev.generate(PROMPT, 24, drafter="model", tree="off", k=k).tokens == want  # chains through the tree form
    for params in ({"temperature": 1.0, "seed": 3}, {"temperature": 0.7, "top_k": 20, "seed": 11}):
        for tree in (4, "auto"):
            want_tokens = pack.generate(PROMPT, 24, drafter="model", tree=tree, **params).tokens  # type: ignore[arg-type]
            assert dev.generate(PROMPT, 24, drafter="model", tree=tree, **params).tokens == want_tokens, (params, tree)  # type: ignore[arg-type]


def _model_tree_samples(pack: Pack, target: Path, params: SamplingParams, n: int,
                        drafter: Callable[[TargetLogits, int], Drafter],
                        policy: Callable[[], KPolicy] | None = None) -> tuple[float, Any]:
    """The chi-square p of n generations of k + 2 = 6 tokens, trees of 4 nodes drafted by `drafter` (or the steps
    `policy` asks for)."""
    k = 4
    prompt = pack.encode(PROMPT)
    logits = TargetLogits(target, prompt)
    part = partitions(logits, pack.eos_ids)(params, k + 2, n)
    samples = draw_samples(pack, drafter(logits, len(prompt)), prompt, params, k, 23, n=n, decided=part.decided,
                           policy=policy or (lambda: FixedTree(k, 4)))
    return pvalue(part, samples), samples


@pytest.fixture(scope="module")
def target_dir(tiny_pairs: Callable[..., tuple[Path, Path]]) -> Path:
    return tiny_pairs("qwen2", "small")[1]


@pytest.mark.parametrize("params", [pytest.param(SamplingParams(1.0, top_k=3), marks=pytest.mark.slow),
                                    SamplingParams(0.7, top_k=5)], ids=str)
def test_sampled_model_trees_keep_the_distribution(pack: Pack, target_dir: Path, params: SamplingParams) -> None:
    p, samples = _model_tree_samples(pack, target_dir, params, SAMPLES,
                                     lambda logits, length: ShapedModelDrafter(pack, TreeShape(3, 2)))
    print(f"model trees {params}: alpha={samples.alpha:.3f} accepted={samples.accepted} p={p:.4g}")
    assert samples.accepted > SAMPLES // 50  # acceptances happen: the accept path and the row moves are tested
    assert p > P_FAIL


def test_a_drafter_peeking_at_the_uniforms_is_rejected(pack: Pack, target_dir: Path) -> None:
    def peeking(logits: TargetLogits, length: int) -> Drafter:
        def best(state: DecodeState) -> int:
            return int(np.argmax(logits([tuple(state.ids[length : state.length].tolist())])[0]))

        return PeekingTrees(ShapedModelDrafter(pack, TreeShape(3, 2)), best)

    p, samples = _model_tree_samples(pack, target_dir, SamplingParams(1.0, top_k=3), SAMPLES // 2, peeking)
    print(f"peeking model trees: alpha={samples.alpha:.3f} p={p:.4g}")
    assert p < P_FAIL


class ChainsAndTrees:
    """A KPolicy whose steps alternate as tree "auto" with the pack's chains may (TreePolicy's chain_max): a chain of 2
    sampled drafts (state.tree None) and a tree of 4 nodes (3 wide, 2 deep: deterministic candidates); `tree_first`:
    the shape of the first step."""

    def __init__(self, tree_first: bool) -> None:
        self.tree_next = not tree_first  # next_k flips it before the first step

    @property
    def k_max(self) -> int:
        return 4

    def next_k(self, state: DecodeState) -> int:
        self.tree_next = not self.tree_next
        state.tree = TreeShape(3, 2) if self.tree_next else None
        return 4 if self.tree_next else 2

    def observe(self, k: int, n_accepted: int, elapsed_s: float, draft_s: float, *,
                tree: TreeStep | None = None) -> None: ...


@pytest.fixture(scope="module")
def noisy_dir(tiny_export: Callable[..., Path]) -> Path:
    """The tree pack of the noisy draft (tiny.py's perturbed copy of the target: it agrees often enough that chains and
    trees accept drafts at most steps)."""
    return tiny_export("qwen2", "noisy", k=4, max_len=64, kv_cache="static", max_tree_nodes=16)


@pytest.fixture(scope="module")
def noisy(noisy_dir: Path) -> Iterator[Pack]:
    loaded = specpack.load(noisy_dir, threads=1)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def noisy_dev(noisy_dir: Path) -> Iterator[Pack]:
    """The same pack on the cuda backend's code on the CPU EP (its trees' rows moved by kv_compact.onnx), one thread."""
    from tests.runtime.test_cuda_backend import device_pack

    loaded = device_pack(noisy_dir, threads=1)
    yield loaded
    loaded.close()


def _mixed(drafter: Drafter, pack: Pack, target_dir: Path, params: SamplingParams, n: int) -> tuple[float, Any]:
    """_model_tree_samples with ChainsAndTrees, generations starting with a chain and with a tree in turn."""
    generations = itertools.count()
    return _model_tree_samples(pack, target_dir, params, n, lambda logits, length: drafter,
                               policy=lambda: ChainsAndTrees(tree_first=next(generations) % 2 == 1))


@pytest.mark.parametrize("params", [SamplingParams(0.7, top_k=5),
                                    pytest.param(SamplingParams(1.0, top_k=3), marks=pytest.mark.slow)], ids=str)
def test_sampled_chains_and_trees_mixed_keep_the_distribution(noisy: Pack, tiny_pairs: Callable[..., tuple[Path, Path]],
                                                              params: SamplingParams) -> None:
    """Tree "auto" with the pack's chains (docs/trees.md, "Chains first") mixes, within one request, chains of sampled
    drafts and trees of deterministic candidates (a tree pack verifies both by the deterministic rule, exact for
    drafts drawn independently of the verify's uniforms): the chi-square of the mixed steps against exact
    probabilities, both orders (chain after tree, tree after chain) in every generation of more than one step, with a
    draft that agrees with the target (drafts accepted at most steps)."""
    drafter = ModelDrafter(noisy.backend.draft, noisy.manifest.k_max)
    p, samples = _mixed(drafter, noisy, tiny_pairs("qwen2", "noisy")[1], params, SAMPLES)
    print(f"chains and trees {params}: alpha={samples.alpha:.3f} accepted={samples.accepted} p={p:.4g}")
    assert samples.accepted > SAMPLES // 2
    assert p > P_FAIL


def test_mixed_steps_with_the_accepted_rows_left_unmoved_are_rejected(noisy: Pack,
                                                                     tiny_pairs: Callable[..., tuple[Path, Path]],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The same test, same size and seed, kills a planted defect of the mixed steps: the target's cache rows of a
    tree's accepted path left where the tree put them (StaticKVCache.keep_rows a no-op), so the chain or tree after it
    reads a wrong context. (Defects on the drafter's side cannot be planted here: the deterministic rule draws each
    token from the target's p with the verify's uniforms and walks to the child equal to it, exact for any candidates
    that do not peek at those uniforms: test_a_drafter_peeking_at_the_uniforms_is_rejected.)"""
    monkeypatch.setattr(StaticKVCache, "keep_rows", lambda self, start, rows: None)
    drafter = ModelDrafter(noisy.backend.draft, noisy.manifest.k_max)
    p, samples = _mixed(drafter, noisy, tiny_pairs("qwen2", "noisy")[1], SamplingParams(0.7, top_k=5), SAMPLES)
    print(f"rows left unmoved: alpha={samples.alpha:.3f} accepted={samples.accepted} p={p:.4g}")
    assert p < P_FAIL


@pytest.mark.slow  # the cuda backend's mixed steps: about 30 s with its planted defect below
def test_the_cuda_backends_mixed_steps_keep_the_distribution(noisy_dev: Pack,
                                                             tiny_pairs: Callable[..., tuple[Path, Path]]) -> None:
    """test_sampled_chains_and_trees_mixed_keep_the_distribution on the cuda backend's code (CPU EP): its own tree
    verify, device caches and kv_compact.onnx moving a tree's accepted rows; the chi-square of the mixed steps
    against exact probabilities."""
    drafter = ModelDrafter(noisy_dev.backend.draft, noisy_dev.manifest.k_max)
    p, samples = _mixed(drafter, noisy_dev, tiny_pairs("qwen2", "noisy")[1], SamplingParams(0.7, top_k=5), SAMPLES)
    print(f"cuda backend, chains and trees: alpha={samples.alpha:.3f} accepted={samples.accepted} p={p:.4g}")
    assert samples.accepted > SAMPLES // 2
    assert p > P_FAIL


@pytest.mark.slow
def test_the_cuda_backends_mixed_steps_without_the_compaction_are_rejected(
        noisy_dev: Pack, tiny_pairs: Callable[..., tuple[Path, Path]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The same test kills the cuda backend's planted defect: kv_compact.onnx never run (DeviceStaticKVCache.keep_rows a
    no-op), so a tree's accepted rows stay where the tree put them."""
    from specpack.runtime.device_buffers import DeviceStaticKVCache

    monkeypatch.setattr(DeviceStaticKVCache, "keep_rows", lambda self, start, rows: None)
    drafter = ModelDrafter(noisy_dev.backend.draft, noisy_dev.manifest.k_max)
    p, samples = _mixed(drafter, noisy_dev, tiny_pairs("qwen2", "noisy")[1], SamplingParams(0.7, top_k=5), SAMPLES)
    print(f"cuda backend, rows left unmoved: alpha={samples.alpha:.3f} accepted={samples.accepted} p={p:.4g}")
    assert p < P_FAIL
