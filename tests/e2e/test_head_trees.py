"""Token trees drafted by the draft head (EAGLE-2's dynamic trees: docs/heads.md, "Trees drafted by the head") on a tiny
head tree pack (`spec-export --kv-cache static --draft-head HEAD --max-tree-nodes 16`, k 4), cpu backend.

- the pack: the head's tree form (draft_positions, draft_mask in; each row's top-K out), kv_compact moving the features
  cache too;
- a tree's rows are the chain's: each expanded node's top-K (tokens exactly, log-probabilities to 1e-5) equal those of
  the head run as a chain along the node's root path (positions, mask and hidden states of the tree runs are right);
- greedy: the target alone's tokens with head trees of several node budgets, widths and depths, tree auto / N / off;
- the features cache after head trees equals the target alone's (rows of accepted siblings moved into place), and
  with the features left in node order (mutation features_not_compacted) it does not;
- sampling: the chi-square of test_sampling_distribution.py with head-drafted trees against exact probabilities, and
  the same test rejects a drafter whose sibling order peeks at the verify's uniforms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import specpack
from specpack import names
from specpack.runtime.backends import cpu
from specpack.runtime.drafter import HeadDrafter
from specpack.runtime.engine import HeadTreeRun, TopRows
from specpack.runtime.pack import Pack
from specpack.runtime.state import DecodeState, Proposal, TreeShape
from specpack.runtime.tree_policy import FixedTree
from specpack.sampling import SamplingParams
from tests.e2e.test_sampling_distribution import P_FAIL, TargetLogits, draw_samples, partitions, pvalue
from tests.mutations import runtime_mutation

PROMPT = "def add(a, b):"
SAMPLES = 1_000


@pytest.fixture(scope="module")
def head_tree_dirs(tiny_head_pack: Callable[..., tuple[Path, Path, Path]]) -> tuple[Path, Path, Path]:
    return tiny_head_pack("qwen2", kv_cache="static", max_tree_nodes=16)


@pytest.fixture(scope="module")
def pack(head_tree_dirs: tuple[Path, Path, Path]) -> Iterator[Pack]:
    loaded = specpack.load(head_tree_dirs[0], threads=1)
    yield loaded
    loaded.close()


class ShapedHeadDrafter(HeadDrafter):
    """The pack's head drafting trees of one shape (width, depth) every step, whatever the policy set."""

    def __init__(self, pack: Pack, shape: TreeShape) -> None:
        super().__init__(pack.backend.draft)
        self.shape = shape

    def propose(self, state: DecodeState, k: int) -> Proposal:
        state.tree = self.shape
        return super().propose(state, k)


def _with(pack: Pack, drafter: HeadDrafter) -> Pack:
    return Pack(pack.path, pack.manifest, pack.tokenizer, pack.backend, drafter)


def test_the_head_tree_pack(pack: Pack) -> None:
    m = pack.manifest
    assert m.head is not None and m.head.tree_width == 8 and m.target.graph.tree is not None
    assert {names.DRAFT_POSITIONS, names.DRAFT_MASK} <= {s.name for s in m.head.graph.inputs}
    assert {names.TREE_TOKENS, names.TREE_LOGPROBS, names.TREE_HIDDEN} <= {s.name for s in m.head.graph.outputs}
    compact = m.target.graph.tree.kv_compact
    assert names.PAST_TARGET_FEATURES in {s.name for s in compact.inputs}
    assert names.TARGET_FEATURES in {s.name for s in compact.outputs}
    # one lm_head product serves the TopK and the sampling logits: its frozen rows are a folded initializer (which
    # --quantize-draft quantizes), never transposed at every run (head_export._TreeStepForward; two products over the
    # same rows left that Transpose: the int4 tree pack's head step cost 4x the concat step's on the CPU)
    step = onnx.load(str(pack.path / names.HEAD_STEP_FILE), load_external_data=False).graph
    initializers = {t.name for t in step.initializer}
    assert not [n.name for n in step.node if n.op_type == "Transpose" and n.input[0] in initializers]


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d["head"].update(tree_width=0), "I/O is not the contract"),  # tree I/O, no tree_width
    (lambda d: d["target"]["graph"]["tree"]["kv_compact"]["inputs"].pop(), "features cache"),
    (lambda d: d["target"]["graph"].pop("tree"), "tree_width"),  # a tree head on a chain target
])
def test_the_manifest_refuses_a_broken_head_tree_pack(head_tree_dirs: tuple[Path, Path, Path],
                                                      mutate: Callable[[dict[str, Any]], object], message: str) -> None:
    import json

    from specpack.contract.manifest import parse_manifest
    from specpack.errors import SpecpackError

    data = json.loads((head_tree_dirs[0] / "manifest.json").read_text())
    parse_manifest(json.dumps(data).encode())
    mutate(data)
    with pytest.raises(SpecpackError, match=message):
        parse_manifest(json.dumps(data).encode())


def test_the_tree_verify_writes_every_rows_features(pack: Pack, head_tree_dirs: tuple[Path, Path, Path]) -> None:
    """verify.onnx of the head tree pack, run alone: after a prefill (a tree of no node), a tree verify writes at node
    i's row the features of its root path: transformers' hidden_states of the head's taps at the node's position."""
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForCausalLM

    m = pack.manifest
    assert m.head is not None
    session = ort.InferenceSession(str(head_tree_dirs[0] / m.target.graph.path), providers=["CPUExecutionProvider"])
    ids = pack.encode(PROMPT)
    parents = np.array([-1, -1, 0, 0, 1, 2, 5], np.int64)
    tokens = np.random.default_rng(3).integers(0, m.vocab_size, len(parents))
    cache = {s.name: np.zeros([m.max_len if d == "max_sequence_length" else d for d in s.shape], np.float32)
             for s in session.get_inputs() if s.name.startswith(("past_", names.PAST_TARGET_FEATURES))}
    for rows, tree in ((np.array(ids[:-1]), parents[:0]), (np.array([ids[-1], *tokens]), parents)):
        start = int(np.flatnonzero(cache[names.PAST_TARGET_FEATURES][0, 0].any(-1)).size)  # rows written so far
        feeds = {names.INPUT_IDS: rows[None], names.POSITION_IDS: start + np.arange(len(rows))[None],
                 names.ATTENTION_MASK: (np.arange(m.max_len) < start + len(rows)).astype(np.int64)[None],
                 names.PARENTS: tree[None], names.UNIFORMS: np.zeros((1, len(tree) + 1), np.float32),
                 names.TEMPERATURE: np.zeros(1, np.float32), names.TOP_K: np.zeros(1, np.int64),
                 names.TOP_P: np.ones(1, np.float32), **cache}
        out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
        cache = {name: out[name.replace("past_key_values", "present") if name != names.PAST_TARGET_FEATURES
                           else names.TARGET_FEATURES] for name in cache}
    features = cache[names.PAST_TARGET_FEATURES][0, 0]  # [M, F]
    model = AutoModelForCausalLM.from_pretrained(head_tree_dirs[2], dtype=torch.float32).eval()
    for node in range(len(parents)):
        path, up = [], node
        while up >= 0:
            path.insert(0, int(tokens[up]))
            up = int(parents[up])
        with torch.no_grad():
            hidden = model(torch.tensor([ids + path]), output_hidden_states=True).hidden_states
        want = torch.cat([hidden[i][0, -1] for i in m.head.taps]).numpy()  # [F]
        np.testing.assert_allclose(features[len(ids) + node], want, rtol=1e-4, atol=1e-4, err_msg=str(node))


class ChainCheckingDrafter(HeadDrafter):
    """Drafts head trees and, before returning each, runs the head as a chain along the root path of every node a tree
    run expanded, checking that run's top-K for the node against the chain's (then puts the proposal back)."""

    def __init__(self, pack: Pack, shape: TreeShape) -> None:
        super().__init__(pack.backend.draft)
        self.shape, self.checked = shape, 0

    def propose(self, state: DecodeState, k: int) -> Proposal:
        state.tree = self.shape
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
        saved = proposal.tokens.copy()
        token_at = {}  # head cache row -> the token of the node it expanded
        for run, top in runs[1:]:
            assert run is not None
            for j, token in enumerate(run.tokens.tolist()):
                token_at[int(top.rows[j])] = token
                path = [token_at[int(row)] for row in run.ancestors[j]] + [token]
                tokens, logprobs = self._chain(model, state, path)
                assert np.array_equal(tokens, top.tokens[j]), (path, tokens, top.tokens[j])
                np.testing.assert_allclose(logprobs, top.logprobs[j], atol=1e-5, rtol=0)
                self.checked += 1
        state.ids[state.length : state.length + len(saved)] = saved
        model.rollback(state, state.length - 1)
        return proposal

    @staticmethod
    def _chain(model: Any, state: DecodeState, path: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The head's top-K after the committed tokens and `path`, run as a chain (the catch-up's last row again, then
        one drafted row per path token): the chain step of the tree form writes its row's top-K into run 0's rows."""
        start = state.length
        model.rollback(state, start - 2)
        model.step(state, start, 0)
        state.ids[start : start + len(path)] = path
        for i in range(len(path)):
            model.step(state, start + 1 + i, 0)
        tree = model.engine.tree
        return tree.tokens[state.slot][0, 0].copy(), tree.logprobs[state.slot][0, 0].copy()


def test_tree_rows_are_the_chains_rows(pack: Pack) -> None:
    drafter = ChainCheckingDrafter(pack, TreeShape(3, 4))
    out = _with(pack, drafter).generate(PROMPT, 12, tree=12)
    print(f"checked {drafter.checked} expanded nodes")
    assert out.stats["tree"] and drafter.checked >= 20, drafter.checked


@pytest.mark.parametrize(("nodes", "width", "depth"), [(1, 1, 1), (4, 2, 2), (8, 4, 3), (16, 8, 2), (16, 2, 8),
                                                       (12, 3, 12)])
def test_greedy_head_trees_equal_the_target_alone(pack: Pack, nodes: int, width: int, depth: int) -> None:
    shaped = _with(pack, ShapedHeadDrafter(pack, TreeShape(width, depth)))
    for prompt in (PROMPT, [5]):
        want = pack.generate(prompt, 24, k=0).tokens
        got = shaped.generate(prompt, 24, tree=nodes)
        assert got.tokens == want and got.stats["tree"], (prompt, nodes, width, depth)


def test_greedy_tree_auto_n_and_off_equal_the_target_alone(pack: Pack) -> None:
    want = pack.generate(PROMPT, 32, k=0).tokens
    for tree in ("auto", 2, 8, 16, "off"):
        got = pack.generate(PROMPT, 32, drafter="head", tree=tree)
        assert got.tokens == want and got.stats["tree"] == (tree != "off"), tree
    assert pack.generate(PROMPT, 32, drafter="head", k=3).tokens == want  # a fixed k: trees of k nodes


class WidthOneHeadDrafter(HeadDrafter):
    """The pack's head asked for trees of width 1 every step (a chain's shape), counting the proposals it drafted as
    trees (parents set)."""

    def __init__(self, pack: Pack, chain_max: int) -> None:
        super().__init__(pack.backend.draft, chain_max=chain_max)
        self.trees = self.steps = 0

    def propose(self, state: DecodeState, k: int) -> Proposal:
        state.tree = TreeShape(1, k)
        proposal = super().propose(state, k)
        self.trees += proposal.parents is not None
        self.steps += 1
        return proposal


def test_a_greedy_width_one_tree_is_drafted_as_a_chain(pack: Pack) -> None:
    """A greedy request's tree of width 1 within the chain's range goes the chain's way (no tree runs), the target
    alone's tokens; past the chain's range, without a chain range, or sampling, it stays a tree."""
    k_max = pack.manifest.k_max
    want = pack.generate(PROMPT, 24, k=0).tokens
    for nodes, chain_max, chains in ((k_max, k_max, True), (k_max + 2, k_max, False), (k_max, 0, False)):
        drafter = WidthOneHeadDrafter(pack, chain_max)
        got = _with(pack, drafter).generate(PROMPT, 24, tree=nodes)
        assert got.tokens == want, (nodes, chain_max)
        assert drafter.steps > 0 and (drafter.trees == 0) == chains, (nodes, chain_max, drafter.trees, drafter.steps)
    drafter = WidthOneHeadDrafter(pack, k_max)
    _with(pack, drafter).generate(PROMPT, 24, tree=k_max, temperature=0.8, seed=3)
    assert drafter.trees == drafter.steps > 0  # sampling: the tree's deterministic candidates, as before


def _features_after(pack: Pack, drafter: HeadDrafter | None, prompt: str, tokens: int) -> tuple[np.ndarray, int]:
    """The features cache rows [0, length - 1) after a greedy generation (head trees, or the target alone)."""
    run = pack if drafter is None else _with(pack, drafter)
    out = run.generate(prompt, tokens, k=0 if drafter is None else None, tree="off" if drafter is None else 16)
    features = pack.backend.target().engine.features[0]  # type: ignore[attr-defined]
    host = features if isinstance(features, np.ndarray) else features.read()  # a device buffer: read back
    length = len(pack.encode(prompt)) + len(out.tokens)
    return host[0, 0, : length - 2].copy(), out.stats["accepted"]


def test_the_features_of_accepted_siblings_move_into_place(pack: Pack, monkeypatch: pytest.MonkeyPatch) -> None:
    moved: list[bool] = []
    real = cpu.OrtTarget.verify_tree

    def counting(self: cpu.OrtTarget, run: Any) -> Any:
        result = real(self, run)
        moved.append(not np.array_equal(result.path, np.arange(len(result.path))))
        return result

    monkeypatch.setattr(cpu.OrtTarget, "verify_tree", counting)
    drafter = ShapedHeadDrafter(pack, TreeShape(8, 2))  # 8 root children: an accepted sibling or grandchild moves rows
    want, _ = _features_after(pack, None, PROMPT, 40)
    got, accepted = _features_after(pack, drafter, PROMPT, 40)
    assert sum(moved) >= 2 and accepted >= 2, (moved, accepted)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    with runtime_mutation("features_not_compacted"):
        stale, _ = _features_after(pack, drafter, PROMPT, 40)
    assert np.abs(stale - want).max() > 1e-2  # the test sees a compaction that does nothing


@pytest.fixture(scope="module")
def dev(head_tree_dirs: tuple[Path, Path, Path]) -> Iterator[Pack]:
    """The cuda backend's code on the CPU EP (tests/runtime/test_cuda_backend.py's device_pack)."""
    from tests.runtime.test_cuda_backend import device_pack

    loaded = device_pack(head_tree_dirs[0])
    yield loaded
    loaded.close()


def test_the_cuda_backends_head_trees(pack: Pack, dev: Pack) -> None:
    """Greedy: the target alone's tokens through the device head's trees (uploaded inputs, outputs read back) and
    kv_compact.onnx moving the features rows on the device (the features cache equals the target alone's); sampling:
    the cpu backend's tokens for the same seed."""
    for nodes, width, depth in ((4, 2, 2), (16, 8, 2), (12, 3, 12)):
        shaped = _with(dev, ShapedHeadDrafter(dev, TreeShape(width, depth)))
        assert shaped.generate(PROMPT, 24, tree=nodes).tokens == pack.generate(PROMPT, 24, k=0).tokens, nodes
    want, _ = _features_after(dev, None, PROMPT, 40)
    got, accepted = _features_after(dev, ShapedHeadDrafter(dev, TreeShape(8, 2)), PROMPT, 40)
    assert accepted >= 2
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert pack.generate(PROMPT, 24, drafter="head", tree="off", k=2).tokens == \
        dev.generate(PROMPT, 24, drafter="head", tree="off", k=2).tokens  # chains through the tree form
    for params in ({"temperature": 1.0, "seed": 3}, {"temperature": 0.7, "top_k": 20, "seed": 11}):
        for tree in (4, "auto"):
            want_tokens = pack.generate(PROMPT, 24, drafter="head", tree=tree, **params).tokens  # type: ignore[arg-type]
            assert dev.generate(PROMPT, 24, drafter="head", tree=tree, **params).tokens == want_tokens, (params, tree)  # type: ignore[arg-type]


def test_a_long_tree_catch_up_runs_as_captured_chunks(pack: Pack, head_tree_dirs: tuple[Path, Path, Path]) -> None:
    """The device head's first tree catch-up over a 45-token prompt (> k_max + 1 rows) goes as captured chunks
    (LONG_CHUNK, then k_max + 1 and the rest), as its chains' do: only captured shapes are bound, the target alone's
    tokens come out, and the head's cache rows equal those one uncaptured run writes."""
    from specpack.runtime.backends.cuda import LONG_CHUNK
    from tests.runtime.test_cuda_backend import device_pack

    prompt = np.random.default_rng(6).integers(0, pack.manifest.vocab_size - 8, 45).tolist()
    want = pack.generate(prompt, 16, k=0).tokens
    chunked, one_run = device_pack(head_tree_dirs[0], chunked_runs=True), device_pack(head_tree_dirs[0])
    try:
        caches = []
        for dev in (chunked, one_run):
            shaped = _with(dev, ShapedHeadDrafter(dev, TreeShape(2, 2)))
            assert shaped.generate(prompt, 16, tree=4).tokens == want
            head = dev.backend.draft().engine  # type: ignore[attr-defined]
            caches.append([buffer.read()[:, :, : len(prompt)] for buffer in head.slots[0].cache._buffers])
        keys = {key[1:] for key in chunked.backend.draft().engine.slots[0].bindings if key[0] == "tree"}  # type: ignore[attr-defined]
        assert all(c <= pack.manifest.k_max + 1 or c == LONG_CHUNK for c, _ in keys), keys
        assert (LONG_CHUNK, 0) in keys
        for got, whole in zip(*caches, strict=True):  # [1, kvh, 45, D] each: the prompt's rows
            assert got.any()
            np.testing.assert_allclose(got, whole, rtol=0, atol=1e-5)
    finally:
        chunked.close()
        one_run.close()


class PeekingDrafter(HeadDrafter):
    """A defect: the head's tree, changed by the verify's own uniform of the first node's test (state.uniforms.verify
    [0, 0], drawn before the step): at u >= 1/2 the first root child becomes the target's most likely token, which
    that test then rejects (p < u). The deterministic rule is exact only for candidates fixed before the uniforms are
    looked at; the target's token only makes the effect large enough to see with a tiny head that rarely agrees."""

    def __init__(self, pack: Pack, shape: TreeShape, logits: TargetLogits, prompt_length: int) -> None:
        super().__init__(pack.backend.draft)
        self.shape, self.logits, self.prompt_length = shape, logits, prompt_length

    def propose(self, state: DecodeState, k: int) -> Proposal:
        state.tree = self.shape
        proposal = super().propose(state, k)
        if proposal.k and state.uniforms.verify[0, 0] >= 0.5:
            done = tuple(state.ids[self.prompt_length : state.length].tolist())
            best = int(np.argmax(self.logits([done])[0]))
            if best not in proposal.tokens.tolist():  # the head's own tokens stay distinct siblings
                proposal.tokens[0] = best
        return proposal


def _head_tree_samples(pack: Pack, dirs: tuple[Path, Path, Path], params: SamplingParams, n: int,
                       drafter: Callable[[TargetLogits, int], HeadDrafter]) -> tuple[float, Any]:
    """The chi-square p of n generations of k + 2 = 6 tokens, trees of 4 nodes drafted by `drafter`."""
    k = 4
    prompt = pack.encode(PROMPT)
    logits = TargetLogits(dirs[2], prompt)
    part = partitions(logits, pack.eos_ids)(params, k + 2, n)
    samples = draw_samples(pack, drafter(logits, len(prompt)), prompt, params, k, 17, n=n, decided=part.decided,
                           policy=lambda: FixedTree(k, 4))
    return pvalue(part, samples), samples


@pytest.mark.parametrize("params", [pytest.param(SamplingParams(1.0, top_k=3), marks=pytest.mark.slow),
                                    SamplingParams(0.7, top_k=5)], ids=str)
def test_sampled_head_trees_keep_the_distribution(pack: Pack, head_tree_dirs: tuple[Path, Path, Path],
                                                  params: SamplingParams) -> None:
    p, samples = _head_tree_samples(pack, head_tree_dirs, params, SAMPLES,
                                    lambda logits, length: ShapedHeadDrafter(pack, TreeShape(3, 2)))
    print(f"head trees {params}: alpha={samples.alpha:.3f} accepted={samples.accepted} p={p:.4g}")
    assert samples.accepted > SAMPLES // 50  # acceptances happen: the accept path and the row moves are tested
    assert p > P_FAIL


def test_a_drafter_peeking_at_the_uniforms_is_rejected(pack: Pack, head_tree_dirs: tuple[Path, Path, Path]) -> None:
    p, samples = _head_tree_samples(pack, head_tree_dirs, SamplingParams(1.0, top_k=3), SAMPLES // 2,
                                    lambda logits, length: PeekingDrafter(pack, TreeShape(3, 2), logits, length))
    print(f"peeking head trees: alpha={samples.alpha:.3f} p={p:.4g}")
    assert p < P_FAIL
