"""The tree verify head and the tree mask graphs against the numpy tree oracle on ONNX Runtime's CPU EP: bit for bit.

Random trees of 0 to 64 nodes (chains, stars, bushy and random shapes; repeated sibling tokens; tokens that are the
target's argmax or a draw from it, so that deep paths are accepted) over the head cases' logits and sampling modes
(tests/graphs/cases.py): the same path, n_accepted and next token as tree_oracle.verify_tree for the given uniforms.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from specpack.graphs import oracle, tree_head, tree_oracle
from specpack.sampling import SamplingParams

from .cases import MODES, cpu_session, random_logits, random_params, sampling_feeds

CASES_PER_MODE = 400
VOCABS = (2, 7, 33, 100, 257, 1025)
F32 = np.float32


@pytest.fixture(scope="module")
def head_session() -> ort.InferenceSession:
    return cpu_session(tree_head.tree_verify_head_model())


def random_parents(rng: np.random.Generator, t: int) -> np.ndarray:
    """[T] topological parents of one random shape."""
    shape = rng.choice(["chain", "star", "bushy", "random"])
    if shape == "chain":
        return np.arange(t, dtype=np.int64) - 1
    if shape == "star":
        return np.full(t, -1, np.int64)
    if shape == "bushy":  # each node's parent among the last few: wide and deep
        return np.array([int(rng.integers(max(-1, j - 4), j)) for j in range(t)], np.int64)
    return np.array([int(rng.integers(-1, j)) for j in range(t)], np.int64)


def _tokens(rng: np.random.Generator, logits: np.ndarray, parents: np.ndarray, params: SamplingParams) -> np.ndarray:
    """[T]: each node's token is its parent row's argmax, a draw from it, a sibling's token, or any token."""
    probs = oracle.transform(logits, params if not params.greedy else SamplingParams(1.0))  # [T+1, V]
    tokens = np.zeros(len(parents), np.int64)
    for j, parent in enumerate(parents):
        row, kind = parent + 1, rng.random()
        if kind < 0.4:
            tokens[j] = np.argmax(logits[row])
        elif kind < 0.7:
            tokens[j] = oracle.draw(probs[row], float(rng.random()))
        elif kind < 0.8 and j > 0:
            tokens[j] = tokens[int(rng.integers(0, j))]  # often a repeated sibling
        else:
            tokens[j] = rng.integers(0, logits.shape[-1])
    return tokens


@pytest.mark.parametrize("mode", MODES)
def test_tree_head_matches_oracle(head_session: ort.InferenceSession, mode: str) -> None:
    rng = np.random.default_rng(700 + MODES.index(mode))
    mismatches, accepted = [], 0
    for i in range(CASES_PER_MODE):
        vocab = int(rng.choice(VOCABS))
        t = int(rng.choice([0, 1, 2, 3, 5, 8, 13, 21, 64]))
        params = random_params(rng, mode, vocab)
        extra = int(rng.integers(0, 3))  # rows before the root the head must skip
        logits = random_logits(rng, t + 1 + extra, vocab)  # [S, V]
        parents = random_parents(rng, t)
        tokens = _tokens(rng, logits[extra:], parents, params)
        uniforms = rng.random(t + 1, dtype=F32)
        input_ids = np.concatenate([rng.integers(0, vocab, 1 + extra), tokens])[None]  # [1, S]
        feeds = {"logits": logits[None], "input_ids": input_ids, "parents": parents[None], "uniforms": uniforms[None],
                 **sampling_feeds(params)}
        n, next_token, path = head_session.run(["n_accepted", "next_token", "path"], feeds)
        want = tree_oracle.verify_tree(logits[extra:], tokens, parents, uniforms, params)
        if (int(n[0]), int(next_token[0])) != (want.n_accepted, want.next_token) or \
                not np.array_equal(path[0], want.rows(t + 1)):
            mismatches.append((i, params, t, path[0].tolist(), want))
        accepted += want.n_accepted
    assert not mismatches, f"{len(mismatches)} of {CASES_PER_MODE} differ, first: {mismatches[:2]}"
    assert accepted >= CASES_PER_MODE // 2, f"only {accepted} nodes accepted in all: the cases test too little"


def test_tree_masks_match_oracle() -> None:
    session = cpu_session(tree_head.tree_mask_model())
    rng = np.random.default_rng(0)
    for t in [0, 1, 2, 3, 7, 16, 33, 63, 64] * 4:
        parents = random_parents(rng, t)
        ancestors, depths, rows = session.run(["ancestors", "depths", "row_mask"], {"parents": parents})
        assert np.array_equal(ancestors.astype(bool), tree_oracle.ancestors(parents))
        assert np.array_equal(depths, tree_oracle.depths(parents))
        assert np.array_equal(rows.astype(bool), tree_oracle.tree_attention_mask(parents))


def test_doubling_rounds_cover_the_deepest_chain() -> None:
    for max_nodes in (1, 2, 3, 64, 65, 2048):
        assert 2 ** tree_head.doubling_rounds(max_nodes) >= max_nodes - 1
    session = cpu_session(tree_head.tree_mask_model(max_nodes=16))
    chain = np.arange(16, dtype=np.int64) - 1
    assert session.run(["depths"], {"parents": chain})[0].tolist() == list(range(1, 17))
