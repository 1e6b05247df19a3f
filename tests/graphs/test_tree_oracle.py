"""The tree oracle (specpack/graphs/tree_oracle.py): a chain is oracle.verify, the rule is exact, and a wrong rule fails.

1. Chains: a tree of width 1 takes the uniforms oracle.verify takes and gives its verdict, over the head cases'
   logits, filters and draft relations (with q for the drawn rules; q one-hot for the deterministic rule).
2. Exact enumeration (no sampling): the closed-form distribution of a tree step's first 3 tokens, completed by the
   target (tests/graphs/trees.py: every candidate draw, every accept / reject event), equals the target's own to
   1e-12, for every rule, tree shape and filter here.
3. Chi-square of the oracle's sampled steps against the target's exact distribution (V = 5, first 3 tokens, 20-64
   bins after pooling), 3,000 steps each: detects Cohen's w >= 0.14-0.17 with 99 % power at P_FAIL 1e-3 (measured
   w of the correct oracle from 3,000 draws: 0.06-0.15, p 0.35-0.97). Each mutation of tests/mutations.py
   (TREE_MUTATIONS) is rejected by the same test at the same size and seed; their effects, measured from 20,000
   draws each, are 2-4x the detectable effect (siblings_see_p 0.39, children_kept 0.60, tested_at_the_root 0.42,
   residual_not_updated 0.47, q_not_renormalized 0.29), p < 1e-29 at 3,000.
4. Greedy: the accepted path is the longest root path along the target's greedy continuation.
5. The tree mask helpers against their definitions.
"""

from __future__ import annotations

import numpy as np
import pytest

from specpack.graphs import oracle, tree_oracle
from specpack.graphs.tree_oracle import RULES, Rule
from specpack.sampling import SamplingParams
from tests.distribution import chi_square_pvalue
from tests.mutations import TREE_MUTATIONS, tree_mutation

from .cases import MODES, VOCABS, verify_case
from .trees import World, build_tree, exact_step, sample_step, top_w

F32 = np.float32
P_FAIL = 1e-3
LENGTH = 3  # tokens per outcome
SAMPLES = 3000
PARAMS = [SamplingParams(1.0), SamplingParams(0.7, top_k=4), SamplingParams(1.3, top_p=0.9),
          SamplingParams(1.0, top_k=3, top_p=0.8)]
SHAPES = [(1,), (2,), (3, 2), (2, 2, 1)]


@pytest.mark.parametrize("mode", MODES)
def test_a_chain_is_oracle_verify(mode: str) -> None:
    rng = np.random.default_rng(300 + MODES.index(mode))
    for i in range(300):
        k = int(rng.integers(0, 7))
        case = verify_case(rng, mode, int(rng.choice(VOCABS)), k)
        target = case.logits[0, -(k + 1):].astype(F32)  # [k+1, V]
        drafts = case.input_ids[0, case.input_ids.shape[1] - k:]  # [k]
        chain, u = np.arange(k) - 1, case.uniforms[0]
        want = oracle.verify(target, drafts, case.draft_probs[0], u, case.params)
        for rule in ("with_replacement", "without_replacement"):
            got = tree_oracle.verify_tree(target, drafts, chain, u, case.params, case.draft_probs[0], rule)
            assert (got.n_accepted, got.next_token) == want, (i, rule, case.params)
            assert got.path == tuple(range(want[0]))
        one_hot = np.eye(target.shape[-1], dtype=F32)[drafts]  # [k, V] q of deterministic drafts
        want = oracle.verify(target, drafts, one_hot, u, case.params)
        got = tree_oracle.verify_tree(target, drafts, chain, u, case.params)
        assert (got.n_accepted, got.next_token) == want, (i, "deterministic", case.params)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_exact_enumeration_is_the_target(params: SamplingParams, rule: Rule) -> None:
    world = World(5, params, seed=PARAMS.index(params))
    target = world.target_outcomes(LENGTH)
    for shape in SHAPES:
        for duplicate in (False, True) if rule == "deterministic" else (False,):
            step = exact_step(world, shape, rule, LENGTH, duplicate)
            gap = max(abs(step.get(o, 0.0) - target.get(o, 0.0)) for o in {*step, *target})
            assert gap < 1e-12, (shape, duplicate, gap)


# (rule, params, shape, world seed, draft noise, a repeated sibling): the chi-square cases
CASES = [("deterministic", PARAMS[0], (3, 2), 1, 1.0, False),
         ("deterministic", PARAMS[1], (2, 2), 2, 1.0, True),
         ("deterministic", PARAMS[2], (3, 1), 3, 2.0, False),
         ("with_replacement", PARAMS[0], (2, 2), 4, 1.0, False),
         ("without_replacement", PARAMS[1], (3, 2), 5, 1.0, False)]
# mutation -> the case that must reject it
MUTATION_CASES = {"siblings_see_p": 0, "children_kept": 0, "tested_at_the_root": 0, "residual_not_updated": 3,
                  "q_not_renormalized": 4}


def _pvalue(case: tuple[Rule, SamplingParams, tuple[int, ...], int, float, bool]) -> float:
    rule, params, shape, seed, noise, duplicate = case
    world = World(5, params, seed=seed, closeness=noise)
    exact = world.target_outcomes(LENGTH)  # before any mutation is entered
    rng = np.random.default_rng(seed)
    return chi_square_pvalue([sample_step(world, shape, rule, LENGTH, rng, duplicate) for _ in range(SAMPLES)], exact)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_tree_step_distribution_is_the_targets(case: tuple[Rule, SamplingParams, tuple[int, ...], int, float, bool]) \
        -> None:
    assert _pvalue(case) > P_FAIL


def test_every_tree_mutation_has_a_case() -> None:
    assert set(MUTATION_CASES) == set(TREE_MUTATIONS)


@pytest.mark.parametrize("mutation", MUTATION_CASES)
def test_chi_square_catches_tree_mutations(mutation: str) -> None:
    case = CASES[MUTATION_CASES[mutation]]
    with tree_mutation(mutation):
        assert _pvalue(case) < P_FAIL


@pytest.mark.parametrize("seed", range(20))
def test_greedy_path_follows_the_targets_argmax(seed: int) -> None:
    world = World(4, SamplingParams(1.0), seed=seed, closeness=0.7)  # the draft's top-w: often the argmax
    tree = build_tree(((1, 2, 3)[seed % 3], 2, 2), top_w(world, duplicate=seed % 2 == 1))
    greedy: list[int] = []  # the target's greedy continuation
    for _ in range(4):
        greedy.append(int(np.argmax(world.logits("p", tuple(greedy)))))
    on_path = [node for node in range(len(tree.tokens)) if list(tree.contexts[node + 1]) == greedy[:len(
        tree.contexts[node + 1])]]
    deepest = max((len(tree.contexts[n + 1]) for n in on_path), default=0)
    uniforms = np.random.default_rng(seed).random(len(tree.tokens) + 1, dtype=F32)  # ignored when greedy
    verdict = tree_oracle.verify_tree(tree.logits(world), tree.tokens, tree.parents, uniforms, SamplingParams(0.0))
    emitted = [int(t) for t in tree.tokens[list(verdict.path)]] + [verdict.next_token]
    assert verdict.n_accepted == deepest
    assert emitted == greedy[: deepest + 1]
    for a, b in zip(verdict.path, verdict.path[1:], strict=False):
        assert tree.parents[b] == a


def _random_parents(rng: np.random.Generator, t: int) -> np.ndarray:
    return np.array([int(rng.integers(-1, j)) for j in range(t)], np.int64)  # [T], topological


def test_tree_masks() -> None:
    rng = np.random.default_rng(0)
    for t in (0, 1, 2, 5, 17, 64):
        parents = _random_parents(rng, t)
        mask = tree_oracle.ancestors(parents)
        for j in range(t):
            chain, node = set(), j
            while node >= 0:
                chain.add(node)
                node = parents[node]
            assert set(np.flatnonzero(mask[j]).tolist()) == chain
            assert tree_oracle.depths(parents)[j] == len(chain)
        rows = tree_oracle.tree_attention_mask(parents)
        assert rows.shape == (t + 1, t + 1) and rows[:, 0].all() and not rows[0, 1:].any()
    chain = np.arange(6) - 1
    assert np.array_equal(tree_oracle.tree_attention_mask(chain), np.tril(np.ones((7, 7), bool)))
    assert np.array_equal(tree_oracle.depths(chain), np.arange(1, 7))


@pytest.mark.parametrize("parents", [[0], [-1, 1], [-2], [-1, 0, 3]])
def test_parents_must_be_topological(parents: list[int]) -> None:
    with pytest.raises(ValueError, match="topological"):
        tree_oracle.ancestors(np.array(parents))


def test_drawn_rules_need_q() -> None:
    with pytest.raises(ValueError, match="needs draft_probs"):
        tree_oracle.verify_tree(np.zeros((2, 3), F32), [1], [-1], np.zeros(2, F32), SamplingParams(1.0),
                                rule="with_replacement")
