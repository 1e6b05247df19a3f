"""The tree verify graph (torch export's tree form + the tree head) and kv_compact.onnx on tiny targets, ORT CPU EP.

For random trees over a tiny target (chains, stars, deep and bushy shapes; tokens that are the parent's argmax, a draw
from it, a repeated sibling or anything; 0-2 committed rows before the root):
- the graph's logits at each node (exposed with graphs/logits_output.py, as the reference backend does) are the
  target's logits on that node's root path alone: the prefix and the path's tokens, run as a plain causal prefill
  of the static standard graph without a tree;
- n_accepted, next_token and path are tree_oracle.verify_tree's on those logits (greedy, the deterministic rule);
- after kv_compact over `path`, the cache rows [0, root + n] are those of a prefill over the accepted chain, and the
  next step's logits (a new tree on that cache) are the target's on the accepted chain + next token;
- a chain (a tree of width 1) gives the chain verify graph's verdict, logits and cache bit for bit.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from specpack import names
from specpack.graphs import oracle, tree_oracle
from specpack.graphs.kv_compact import kv_compact_model
from specpack.graphs.logits_output import with_logits_output
from specpack.sampling import SamplingParams
from tests.tiny_cache import plain_graph

MAX_NODES = 64  # the graphs are built for the largest trees (6 pointer-doubling rounds)
CACHE = 112  # M: the static buffers' length
F32 = np.float32
# (family, attention of the tree graph); the reference is always the standard form without a tree
FORMS = [("qwen2", "standard"), *(pytest.param(f, marks=pytest.mark.slow, id=f"{f[0]}-{f[1]}") for f in (
    ("qwen2", "gqa"), ("llama", "standard"), ("mistral", "gqa"), ("gpt2", "standard")))]
GQA_HEAD_DIM = 16  # GroupQueryAttention needs a multiple of 8 (the tiny pairs' default is 12)
# low temperatures: the tiny targets' distributions are flat, and accepted nodes are what compaction is tested on
MODES = {"greedy": SamplingParams(), "sampling": SamplingParams(0.4), "filtered": SamplingParams(0.3, top_k=8, top_p=0.9)}
SIZES = (1, 2, 3, 5, 8, 13, 21, 64)  # nodes per tree, one tree each
LOGITS_ATOL = 1e-4  # fp32: a node's row sums over other masked columns than its chain's (measured <= 4e-6)
CACHE_ATOL = 1e-5


def _session(model: bytes | str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


@dataclass
class Graphs:
    """The sessions of one tiny target: the tree verify graph, the chain verify graph and the plain graph (static
    cache, standard attention; the verify graphs with their internal logits exposed) and kv_compact."""

    tree: ort.InferenceSession
    chain: ort.InferenceSession
    plain: ort.InferenceSession
    compact: ort.InferenceSession
    vocab: int

    @property
    def kv(self) -> list[str]:
        return [i.name for i in self.plain.get_inputs() if i.name.startswith("past_key_values.")]

    def empty_cache(self) -> dict[str, np.ndarray]:
        shape = self.plain.get_inputs()[-1].shape
        return {name: np.zeros((1, shape[1], CACHE, shape[3]), F32) for name in self.kv}


@pytest.fixture(scope="module", params=FORMS, ids=lambda f: f"{f[0]}-{f[1]}")
def graphs(request: pytest.FixtureRequest, tiny_pairs: Callable[..., tuple[Path, Path]], tiny_store) -> Graphs:
    from specpack.export.graph_form import GraphForm
    from specpack.export.model_info import read_model_info
    from specpack.export.torch_export import export_plain_graph
    from specpack.graphs.attach import build_tree_verify_graph, build_verify_graph

    family, attention = request.param
    target = tiny_pairs(family, **({"head_dim": GQA_HEAD_DIM} if attention == "gqa" else {}))[1]
    info = read_model_info(target)
    form, standard = GraphForm("static", attention), GraphForm("static", "standard")

    def build(root: Path) -> None:
        export_plain_graph(target, root / "tree" / "plain.onnx", "fp32", form, tree_nodes=MAX_NODES)
        build_tree_verify_graph(root / "tree" / "plain.onnx", root / "verify_tree.onnx", info.vocab_rows, MAX_NODES)
        # attaching moves the weights: the chain's a copy of the static plain graph (the static packs' own export)
        shutil.copytree(plain_graph(tiny_store, target, "target.onnx", "fp32", form), root / "chain")
        build_verify_graph(root / "chain" / "target.onnx", root / "verify_chain.onnx", info.vocab_rows)
        shutil.rmtree(root / "tree")
        shutil.rmtree(root / "chain")

    root = tiny_store.get(("tree-verify", family, attention, MAX_NODES), build)
    plain = plain_graph(tiny_store, target, "target.onnx", "fp32", standard) / "target.onnx"
    compact = kv_compact_model(info.num_layers, info.kv_heads, info.head_dim).SerializeToString()
    return Graphs(tree=_session(with_logits_output(root / "verify_tree.onnx", "fp32")),
                  chain=_session(with_logits_output(root / "verify_chain.onnx", "fp32")),
                  plain=_session(str(plain)), compact=_session(compact), vocab=info.vocab_rows)


def _run(session: ort.InferenceSession, cache: dict[str, np.ndarray], ids: list[int], length: int,
         **extra: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One run over `ids` after `length` cached positions (position_ids length ..): outputs, the new cache."""
    mask = np.zeros((1, CACHE), np.int64)
    mask[0, : length + len(ids)] = 1
    feeds = {names.INPUT_IDS: np.array([ids], np.int64), names.ATTENTION_MASK: mask,
             names.POSITION_IDS: np.arange(length, length + len(ids), dtype=np.int64)[None], **cache, **extra}
    wanted = {i.name for i in session.get_inputs()}
    out = dict(zip([o.name for o in session.get_outputs()], session.run(None, {k: v for k, v in feeds.items()
                                                                                  if k in wanted}), strict=True))
    return out, {name: out[name.replace("past_key_values", "present")] for name in cache}


def _target(g: Graphs, tokens: list[int]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The target alone on `tokens` (one causal prefill, no tree): logits [S, V] and the cache."""
    out, cache = _run(g.plain, g.empty_cache(), tokens, 0)
    return out[names.LOGITS][0], cache


def _root_path(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@dataclass
class Tree:
    parents: list[int]
    tokens: list[int]
    want: np.ndarray  # [T+1, V] the target's logits on each row's root path alone


def _grow(rng: np.random.Generator, g: Graphs, prefix: list[int], size: int, params: SamplingParams) -> Tree:
    """A random tree of `size` nodes after `prefix` (its last token the root), node by node, with the target's logits
    at each node (so that tokens can be its parent's argmax or a draw from it, and deep paths are accepted)."""
    parents: list[int] = []
    tokens: list[int] = []
    want = [_target(g, prefix)[0][-1]]
    shape = rng.choice(["chain", "star", "deep", "random", "breadth", "breadth"])
    width = int(rng.integers(2, 4))
    for j in range(size):  # breadth: a full tree of `width` children per node in breadth-first order (paths move)
        parent = {"chain": j - 1, "star": -1, "deep": j - 1 if rng.random() < 0.6 else int(rng.integers(-1, j)),
                  "random": int(rng.integers(-1, j)), "breadth": j // width - 1}[str(shape)]
        row, kind = want[parent + 1], rng.random()
        siblings = [tokens[i] for i in range(j) if parents[i] == parent]
        if kind < 0.5:
            token = int(np.argmax(row))
        elif kind < 0.75:
            probs = oracle.transform(row[None], params if not params.greedy else SamplingParams(1.0))[0]
            token = oracle.draw(probs, float(rng.random()))
        elif kind < 0.85 and siblings:
            token = int(rng.choice(siblings))
        else:
            token = int(rng.integers(0, g.vocab))
        parents.append(parent)
        tokens.append(token)
        want.append(_target(g, prefix + [tokens[i] for i in _root_path(parents, j)])[0][-1])
    return Tree(parents, tokens, np.stack(want))


def _tree_step(g: Graphs, cache: dict[str, np.ndarray], committed: list[int], length: int, tree: Tree,
               params: SamplingParams, uniforms: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The tree verify over committed[length:] (the root last) and the tree's nodes."""
    return _run(g.tree, cache, committed[length:] + tree.tokens, length,
                parents=np.array(tree.parents, np.int64).reshape(1, -1), uniforms=uniforms[None],
                **{k: v for k, v in params.graph_inputs().items()})


def _compact(g: Graphs, cache: dict[str, np.ndarray], end: int, path: np.ndarray) -> dict[str, np.ndarray]:
    """kv_compact after a verify whose rows ended at `end` (= root row + T + 1)."""
    mask = np.zeros((1, CACHE), np.int64)
    mask[0, :end] = 1
    out = g.compact.run(None, {names.ATTENTION_MASK: mask, names.PATH: path, **cache})
    return dict(zip(cache, out, strict=True))


def _prefill(g: Graphs, prompt: list[int], extra: int) -> tuple[dict[str, np.ndarray], int]:
    """The tree graph as a prefill (T = 0) of all but the last 1 + extra prompt tokens; checks its logits."""
    length = len(prompt) - 1 - extra
    out, cache = _run(g.tree, g.empty_cache(), prompt[:length], 0, parents=np.zeros((1, 0), np.int64),
                      uniforms=np.zeros((1, 1), F32), **SamplingParams().graph_inputs())
    np.testing.assert_allclose(out[names.LOGITS][0, -1], _target(g, prompt[:length])[0][-1], atol=LOGITS_ATOL)
    return cache, length


@pytest.mark.parametrize("mode", MODES)
def test_tree_logits_verdict_and_compaction(graphs: Graphs, mode: str) -> None:
    g, params = graphs, MODES[mode]
    rng = np.random.default_rng(2300 + list(MODES).index(mode))
    accepted, moved, worst_logits, worst_cache = 0, 0, 0.0, 0.0
    for size in SIZES * 2:
        prompt = [int(t) for t in rng.integers(0, g.vocab, int(rng.integers(4, 12)))]
        extra = int(rng.integers(0, 3))  # committed rows before the root, not yet in the cache
        cache, length = _prefill(g, prompt, extra)
        tree = _grow(rng, g, prompt, size, params)
        uniforms = rng.random(size + 1, dtype=F32)
        out, cache = _tree_step(g, cache, prompt, length, tree, params, uniforms)

        # 1. each node's logits are the target's on its root path alone
        logits = out[names.LOGITS][0]  # [T+1, V] the rows the head reads
        np.testing.assert_allclose(logits, tree.want, atol=LOGITS_ATOL, err_msg=f"{size} nodes {tree.parents}")
        worst_logits = max(worst_logits, float(np.abs(logits - tree.want).max()))

        # 2. the verdict is the oracle's on those logits
        want = tree_oracle.verify_tree(logits, np.array(tree.tokens), np.array(tree.parents), uniforms, params)
        n, path = int(out[names.N_ACCEPTED][0]), out[names.PATH]
        assert (n, int(out[names.NEXT_TOKEN][0])) == (want.n_accepted, want.next_token), (size, tree.parents)
        assert np.array_equal(path[0], want.rows(size + 1))
        accepted += n
        moved += list(want.path) != list(range(n))  # kv_compact moves rows

        # 3. after kv_compact the cache is the accepted chain's
        root = len(prompt) - 1  # the root's cache row
        cache = _compact(g, cache, root + size + 1, path)
        chain = prompt + [tree.tokens[node] for node in want.path]
        _, chain_cache = _target(g, chain)
        for name in g.kv:
            np.testing.assert_allclose(cache[name][:, :, : root + n + 1], chain_cache[name][:, :, : root + n + 1],
                                       atol=CACHE_ATOL, err_msg=name)
            worst_cache = max(worst_cache, float(np.abs(cache[name][:, :, : root + n + 1]
                                                        - chain_cache[name][:, :, : root + n + 1]).max()))

        # 4. the next step on the compacted cache: the target's logits after the chain and the next token
        committed = [*chain, want.next_token]
        after = _grow(rng, g, committed, 3, params)
        out, _ = _tree_step(g, cache, committed, root + n + 1, after, params, rng.random(4, dtype=F32))
        np.testing.assert_allclose(out[names.LOGITS][0], after.want, atol=LOGITS_ATOL)
    if mode == "greedy":  # compaction depends on the path alone: greedy trees give long ones
        assert accepted >= len(SIZES) and moved >= 4, f"too few paths to test compaction: {accepted}, {moved} moved"
    print(f"{mode}: {accepted} nodes accepted, {moved} paths moved; |logits - target| <= {worst_logits:.1e}, "
          f"|cache| <= {worst_cache:.1e}")


@pytest.mark.parametrize("mode", MODES)
def test_a_chain_is_the_chain_verify(graphs: Graphs, mode: str) -> None:
    """parents -1, 0, .., k-2: the tree graph's logits, cache and verdict are the chain verify's (q one-hot: the rule
    for deterministic drafts) bit for bit."""
    g, params = graphs, MODES[mode]
    rng = np.random.default_rng(2400 + list(MODES).index(mode))
    for k in (0, 1, 2, 4, 8, 16):
        prompt = [int(t) for t in rng.integers(0, g.vocab, int(rng.integers(4, 12)))]
        cache, length = _prefill(g, prompt, 0)
        drafts = [int(t) for t in rng.integers(0, g.vocab, k)]
        if k and rng.random() < 0.7:
            drafts[0] = int(np.argmax(_target(g, prompt)[0][-1]))  # at least the first often accepted
        uniforms = rng.random(k + 1, dtype=F32)
        tree = Tree(list(range(-1, k - 1)), drafts, np.zeros(0))
        got, got_cache = _tree_step(g, cache, prompt, length, tree, params, uniforms)
        one_hot = np.zeros((1, k, g.vocab), F32)
        one_hot[0, np.arange(k), drafts] = 1.0
        want, want_cache = _run(g.chain, cache, prompt[length:] + drafts, length, draft_probs=one_hot,
                                uniforms=uniforms[None], **params.graph_inputs())
        for name in (names.N_ACCEPTED, names.NEXT_TOKEN, names.LOGITS):
            assert np.array_equal(got[name], want[name]), (k, name)
        n = int(got[names.N_ACCEPTED][0])
        assert got[names.PATH][0].tolist() == [*range(n + 1), *[-1] * (k - n)]
        for name in g.kv:
            assert np.array_equal(got_cache[name], want_cache[name]), (k, name)
