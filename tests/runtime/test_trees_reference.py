"""Token trees through the loop on the reference backend (docs/trees.md): the runtime's side of a tree verify (the
accepted path moved into place in state.ids and the cache, the rest dropped) over the tree oracle, with bigram tables.

Greedy: the output is the target alone's, with trees whose first child is wrong and a later sibling right (the
sibling path is taken) and with the n-gram drafter's tries. Sampling: a deterministic tree drafter (the draft table's
top-3 tokens at the root, the top-2 under the first) keeps the target's distribution by chi-square, exactly as
tests/runtime/test_sampling_reference.py's chains do (V = 10, the first 3 tokens, 2,500 generations: w >= 0.17-0.21
detected at 99 % power), and the tree oracle's defects that touch deterministic siblings (a sibling tested against p
instead of the residual; the final draw keeping the rejected children) are rejected by the same test at the same size
and seed, as is a child tested against the root's p instead of its parent's.
"""

from __future__ import annotations

import numpy as np
import pytest
from harness import bigram_backend, greedy_reference, run, table

from specpack.runtime.ngram_drafter import NgramConfig, NgramDrafter
from specpack.runtime.ngram_index import NgramIndex
from specpack.runtime.ngram_trie import continuation_trie
from specpack.runtime.state import DecodeState, Proposal
from specpack.runtime.tree_policy import FixedTree
from specpack.sampling import SamplingParams
from tests.distribution import chi_square_pvalue, exact_continuations, transformed_next_probs
from tests.mutations import tree_mutation

V, PROMPT, LENGTH, SAMPLES, P_FAIL = 10, [3], 3, 2500, 1e-3


class TopTree:
    """A deterministic tree drafter over a bigram table: the table's top `width` tokens after the last committed one
    as the root's children, the top 2 after the first child as its children (q None: candidates fixed by the
    context). `wrong_first`: the first root child is a token the table ranks last (never the target's choice when
    the table is the target's: the walk must go through a sibling)."""

    def __init__(self, logits: np.ndarray, width: int = 3, wrong_first: bool = False) -> None:
        self.logits, self.width, self.wrong_first = logits, width, wrong_first
        self.trees = 0

    def begin(self, state: DecodeState) -> None: ...

    def propose(self, state: DecodeState, k: int) -> Proposal:
        order = np.argsort(-self.logits[state.ids[state.length - 1]], kind="stable")  # [V] best first
        roots = [int(t) for t in order[: self.width]]
        if self.wrong_first:
            roots = [int(order[-1]), *roots[: self.width - 1]]
        below = [int(t) for t in np.argsort(-self.logits[roots[0]], kind="stable")[:2]]
        tokens, parents = [*roots, *below][:k], [*([-1] * len(roots)), 0, 0][:k]
        start = state.length
        state.ids[start : start + len(tokens)] = tokens
        self.trees += 1
        return Proposal(state.ids[start : start + len(tokens)], None, np.asarray(parents, np.int64))

    def commit(self, state: DecodeState) -> None: ...


def test_the_trie_merges_occurrences_best_first() -> None:
    ids = np.array([7, 1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3, 5, 1, 2], np.int64)
    index = NgramIndex(2, 2)
    index.extend(ids, len(ids))
    ends = index.matches(4)
    assert ends == [11, 7, 3]  # every earlier occurrence of the suffix (1, 2), the latest first
    tokens, parents = continuation_trie(ids, ends, len(ids), 6, frozenset({5}))
    # continuations (budget 6, committed tokens only, cut after the eos 5): 3 5 (end 11) | 4 9 1 2 3 5 (end 7) |
    # 3 9 1 2 4 9 (end 3). The token 3 starts two of them: first; then the later occurrences' tokens before the
    # earlier ones', each node's children entering the frontier once it is chosen.
    assert tokens == [3, 5, 4, 9, 1, 2]
    assert parents == [-1, 0, -1, 2, 3, 4]


def test_greedy_trees_take_the_sibling_the_target_picks() -> None:
    t = table(V, 1)
    backend = bigram_backend(t, t)
    want = greedy_reference(t, PROMPT, 30, frozenset())
    drafter = TopTree(t, wrong_first=True)
    state, _ = run(backend, PROMPT, 30, 5, drafter=drafter)
    assert state.out == want
    assert drafter.trees > 0 and state.stats.accepted >= drafter.trees  # every tree had the right token as a sibling
    assert backend.target().engine.cache(0).length == state.length - 1


@pytest.mark.parametrize("width", [2, 4])
def test_greedy_ngram_tries_equal_the_target_alone(width: int) -> None:
    t = table(V, 2, sharp=1.0)
    prompt = [int(x) for x in np.random.default_rng(5).integers(0, V, 40)]
    want = greedy_reference(t, prompt, 40, frozenset())
    state, _ = run(bigram_backend(t, t), prompt, 40, FixedTree(6, width),
                   drafter=NgramDrafter(NgramConfig(1, 3, width=width)), max_len=128)
    assert state.out == want and state.stats.proposed > 0


def _tables() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    target = rng.normal(0, 1.5, (V, V)).astype(np.float32)
    return target, target + rng.normal(0, 1.0, (V, V)).astype(np.float32)


def _samples(params: SamplingParams) -> list[tuple[int, ...]]:
    target, draft = _tables()
    backend = bigram_backend(target, draft)
    rng = np.random.Generator(np.random.Philox(4321))
    drafter = TopTree(draft)
    # LENGTH + 5 new tokens: the first tree has all 5 nodes (k is capped at the tokens still allowed)
    return [tuple(run(backend, PROMPT, LENGTH + 5, 5, params=params, generator=rng, max_len=16,
                      drafter=drafter)[0].out[:LENGTH]) for _ in range(SAMPLES)]


def _exact(params: SamplingParams) -> dict[tuple[int, ...], float]:
    target, _ = _tables()
    return exact_continuations(transformed_next_probs(lambda ids: target[ids[-1]], params), PROMPT, LENGTH,
                               frozenset())


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, top_k=5)], ids=str)
def test_sampled_trees_keep_the_distribution(params: SamplingParams) -> None:
    p = chi_square_pvalue(_samples(params), _exact(params))
    print(f"p = {p:.3g}")
    assert p > P_FAIL


@pytest.mark.parametrize("mutation", ["siblings_see_p", "children_kept", "tested_at_the_root"])
def test_the_tree_oracles_defects_are_rejected(mutation: str) -> None:
    params = SamplingParams(1.0)
    with tree_mutation(mutation):
        p = chi_square_pvalue(_samples(params), _exact(params))
    print(f"{mutation}: p = {p:.3g}")
    assert p < P_FAIL
