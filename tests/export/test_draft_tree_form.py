"""The draft model's tree form (export/torch_export.py draft_tree + graphs/draft_tree_head.py; docs/trees.md, "Trees
drafted by the draft model"), graph against graph on the tiny qwen2 draft:

- run as a chain (no own row: draft_positions [1, 0], draft_mask [1, 0, M]) it is the chain form's draft_step.onnx bit
  for bit (token, q at temperature 1, every cache row) over a prefill and single steps, and its top-K row is the last
  row's; in the standard form, and (`slow`) in the gqa form, whose GroupQueryAttention then takes a zero bias;
- own rows at draft_positions reading what draft_mask allows (a tree of 5 nodes, 2 depths): each row's best token is
  the argmax of the chain form's q over that row's root path, the top-K best first, the last row repeated after the own
  rows (tests/e2e/test_model_trees.py checks every top-K token and log-probability through the engines);
- refusals: the tree form on a concat cache.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from specpack import names
from specpack.errors import SpecpackError
from specpack.export.graph_form import GraphForm

M, K, VOCAB = 32, 8, 256  # the cache rows, the TopK, the tiny vocabulary


def _sessions(tmp_path: Path, tiny_pairs: Callable[..., tuple[Path, Path]], tiny_plain_graph: Callable[..., Path],
              attention: str, head_dim: int) -> tuple[object, object]:
    import onnxruntime as ort

    from specpack.export.torch_export import export_plain_graph
    from specpack.graphs.attach import build_draft_step_graph, build_draft_tree_step_graph

    tree_plain = tmp_path / "tree.onnx"
    export_plain_graph(tiny_pairs("qwen2", head_dim=head_dim)[0], tree_plain, "fp32", GraphForm("static", attention),
                       draft_tree=True)
    plain = tiny_plain_graph("qwen2", role="draft", kv_cache="static", attention=attention, head_dim=head_dim)
    chain_plain = tmp_path / plain.name  # a copy: attach moves the weights (its data file keeps its name)
    shutil.copy(plain, chain_plain)
    shutil.copy(plain.with_name(f"{plain.name}.data"), tmp_path / f"{plain.name}.data")
    build_draft_tree_step_graph(tree_plain, tmp_path / "tree_step.onnx", VOCAB, K)
    build_draft_step_graph(chain_plain, tmp_path / "chain_step.onnx", VOCAB)
    return (ort.InferenceSession(str(tmp_path / "chain_step.onnx"), providers=["CPUExecutionProvider"]),
            ort.InferenceSession(str(tmp_path / "tree_step.onnx"), providers=["CPUExecutionProvider"]))


def _run(session: object, ids: np.ndarray, start: int, cache: dict[str, np.ndarray],
         own: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One run over ids [S] at cache rows start..; own: (positions [W], mask [W, M]) of the last W rows (tree form)."""
    s = len(ids)
    feeds = {names.INPUT_IDS: ids[None], names.POSITION_IDS: (start + np.arange(s))[None],
             names.ATTENTION_MASK: (np.arange(M) < start + s).astype(np.int64)[None], **cache,
             names.TEMPERATURE: np.ones(1, np.float32), names.TOP_K: np.zeros(1, np.int64),  # q: the logits' softmax
             names.TOP_P: np.ones(1, np.float32), names.UNIFORM: np.full(1, 0.5, np.float32)}
    if own is not None:
        feeds[names.DRAFT_POSITIONS], feeds[names.DRAFT_MASK] = own[0][None], own[1][None]
    out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))  # type: ignore[attr-defined]
    return out, {name: out[name.replace("past_key_values", "present")] for name in cache}


@pytest.mark.parametrize(("attention", "head_dim"), [
    ("standard", 12), pytest.param("gqa", 16, marks=pytest.mark.slow),  # gqa: a zero attention_bias at W = 0
])
def test_the_tree_form_serves_chains_and_trees(tmp_path: Path, tiny_pairs: Callable[..., tuple[Path, Path]],
                                               tiny_plain_graph: Callable[..., Path], attention: str,
                                               head_dim: int) -> None:
    chain, tree = _sessions(tmp_path, tiny_pairs, tiny_plain_graph, attention, head_dim)
    kv = {i.name: np.zeros((1, i.shape[1], M, i.shape[3]), np.float32) for i in chain.get_inputs()  # type: ignore[attr-defined]
          if i.name.startswith("past")}
    none = (np.zeros(0, np.int64), np.zeros((0, M), np.bool_))
    ids = np.random.default_rng(0).integers(0, VOCAB, 12)
    chain_kv, tree_kv, start = kv, kv, 0
    for piece in (ids[:9], ids[9:10], ids[10:11], ids[11:]):  # a prefill, then single steps
        want, chain_kv = _run(chain, piece, start, chain_kv)
        got, tree_kv = _run(tree, piece, start, tree_kv, none)
        assert np.array_equal(want[names.TOKEN], got[names.TOKEN]) and np.array_equal(want[names.PROBS], got[names.PROBS])
        assert all(np.array_equal(chain_kv[n], tree_kv[n]) for n in kv)  # bit for bit
        assert got[names.TREE_TOKENS].shape == (1, 1, K) and got[names.TREE_TOKENS][0, 0, 0] == np.argmax(want[names.PROBS])
        start += len(piece)
    # a tree under the last committed token (row start - 1): 3 root children, then 2 children of the first
    tokens, parents = np.array([5, 9, 13, 21, 34]), [-1, -1, -1, 0, 0]
    depth = np.array([1, 1, 1, 2, 2])
    mask = np.zeros((5, M), np.bool_)
    mask[:, :start] = True
    for i, p in enumerate(parents):
        mask[i, start + i] = True
        if p >= 0:
            mask[i, start + p] = True
    got, _ = _run(tree, tokens, start, tree_kv, (start - 1 + depth, mask))  # positions: the root's + depth
    assert got[names.TREE_TOKENS].shape == (1, 6, K)
    assert np.array_equal(got[names.TREE_TOKENS][0, 4], got[names.TREE_TOKENS][0, 5])  # the last row repeated
    for i, p in enumerate(parents):
        path = [tokens[p], tokens[i]] if p >= 0 else [tokens[i]]
        want, _ = _run(chain, np.array(path), start, chain_kv)  # the chain form over the node's root path
        assert got[names.TREE_TOKENS][0, i, 0] == np.argmax(want[names.PROBS]), i  # q at temperature 1: its argmax
        assert np.all(np.diff(got[names.TREE_LOGPROBS][0, i]) <= 0)  # best first


def test_the_tree_form_is_refused_on_a_concat_cache(tmp_path: Path, tiny_pairs: Callable[..., tuple[Path, Path]]) -> None:
    from specpack.export.torch_export import export_plain_graph

    with pytest.raises(SpecpackError, match="the draft's tree form"):
        export_plain_graph(tiny_pairs("qwen2")[0], tmp_path / "d.onnx", "fp32", GraphForm("concat", "standard"),
                           draft_tree=True)
