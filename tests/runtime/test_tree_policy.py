"""The tree size policy (runtime/tree_policy.py) on fake costs and hand-set acceptance, and through the loop on the
reference backend: a chain is a tree of width 1 (adaptive k's model exactly), the expected tokens of a tree are its
path products, a steep v(T) shrinks the budget to a short chain, a flat v(T) with siblings often right grows a wide
tree, the policy never rates a budget below the chain of it, and greedy output stays the target alone's."""

from __future__ import annotations

import numpy as np
import pytest
from harness import bigram_backend, greedy_reference, run, table

from specpack.runtime.adaptive_k import AcceptanceModel, AdaptiveConfig, AdaptiveK, PriorCosts
from specpack.runtime.ngram_drafter import NgramConfig, NgramDrafter
from specpack.runtime.state import TreeShape, TreeStep
from specpack.runtime.tree_policy import FixedTree, TreeAcceptance, TreePolicy

CPU_V = [1.0, 1.07, 1.17, 1.2, 1.22, 1.26, 1.29, 1.32, 1.35]  # v(k) of the real pair on the 2-core CPU (fp32)
STEEP = [1.0 + 0.5 * t for t in range(17)]                     # int4 on a 2-core CPU grows about this fast
FLAT = [1.0 + 0.01 * t for t in range(17)]                     # a GPU: v(16) = 1.16


class TableCosts:
    """A Costs of fixed relative times: d per node, V(T) = v[T] (no clock)."""

    def __init__(self, v: list[float], d: float = 0.0) -> None:
        self.v, self.d = v, d

    def start(self) -> None: ...

    def measured(self, k: int) -> bool:
        return True

    def any_measured(self) -> bool:
        return True

    def observe(self, k: int, elapsed_s: float, draft_s: float, per_draft: bool = True, skipped: int = 0) -> None: ...

    def probe_cost(self) -> float:
        return 0.0

    def step_times(self, out: list[float]) -> None:
        for t in range(len(out)):
            out[t] = t * self.d + self.v[t]


def tree(parents: list[int], path: list[int]) -> TreeStep:
    return TreeStep(np.asarray(parents, np.int64), np.asarray(path, np.int64))


def set_rates(model: TreeAcceptance, rates: dict[tuple[int, int], float], weight: float = 1e6) -> None:
    """Counts that make a(d, r) = rates[(d, r)] (depth d >= 1, rank r) to within 1e-5, 0 elsewhere."""
    model.reached[:] = weight
    model.passed[:] = 0.0
    for (d, r), a in rates.items():
        model.passed[d - 1, r] = a * weight


def test_a_chain_is_a_tree_of_width_one() -> None:
    """Width 1: the same counts and expected tokens as adaptive k's AcceptanceModel, step for step."""
    config = AdaptiveConfig()
    chain, trees = AcceptanceModel(8, config), TreeAcceptance(8, 1, config)
    rng = np.random.default_rng(0)
    want, got = [0.0] * 9, [0.0] * 9
    for _ in range(200):
        k = int(rng.integers(0, 9))
        n = int(min(k, rng.geometric(0.3) - 1))
        chain.observe(k, n)
        trees.observe(k, n)
        chain.expected_accepted(want)
        trees.expected_accepted(got)
        assert got == pytest.approx(want, rel=1e-12)
    # and the same chain given as a tree (parents, path) counts alike
    as_tree = TreeAcceptance(8, 1, config)
    as_tree.observe(5, 2, tree([-1, 0, 1, 2, 3], [0, 1]))
    as_chain = TreeAcceptance(8, 1, config)
    as_chain.observe(5, 2)
    assert (as_tree.reached == as_chain.reached).all() and (as_tree.passed == as_chain.passed).all()


def test_a_tree_step_counts_by_depth_and_rank() -> None:
    """parents [-1, -1, 0, 0, 1, 2]: root children 0 (rank 0), 1 (rank 1); under 0: 2, 3; under 1: 4; under 2: 5.
    Path [0, 3]: node 0, then its second child. Reached: nodes whose parent was accepted (or the root's)."""
    model = TreeAcceptance(6, 3, AdaptiveConfig())
    model.observe(6, 2, tree([-1, -1, 0, 0, 1, 2], [0, 3]))
    reached = {(d + 1, r) for d, r in zip(*np.nonzero(model.reached), strict=True)}
    passed = {(d + 1, r) for d, r in zip(*np.nonzero(model.passed), strict=True)}
    assert reached == {(1, 0), (1, 1), (2, 0), (2, 1)}  # node 4 (parent 1 rejected) and 5 (parent 2) not reached
    assert passed == {(1, 0), (2, 1)}


def test_expected_tokens_are_the_best_trees_path_products() -> None:
    """a(1, 0) = 0.6, a(1, 1) = 0.35, a(2, 0) = 0.5, a(2, 1) = 0.2 (deeper: a(d, 0) = 0.5). Best trees by path
    product: 0.6 (root child 0), 0.35 (root child 1), 0.3 (0's first child), 0.175 (1's first child; not 0's
    grandchild 0.15 nor 0's second child 0.12), so E[accepted | 1..4] = 0.6, 0.95, 1.25, 1.425."""
    model = TreeAcceptance(8, 2, AdaptiveConfig())
    set_rates(model, {(1, 0): 0.6, (1, 1): 0.35, (2, 0): 0.5, (2, 1): 0.2, **{(d, 0): 0.5 for d in range(3, 9)}})
    out = [0.0] * 9
    model.expected_accepted(out)
    assert out[:5] == pytest.approx([0.0, 0.6, 0.95, 1.25, 1.425], abs=1e-4)
    assert model.shape(1) == TreeShape(1, 1)
    assert model.shape(2) == TreeShape(2, 1)
    assert model.shape(3) == TreeShape(2, 2)
    # without siblings the same budget expects less: the chain 0.6 + 0.3 + 0.15
    chain = TreeAcceptance(8, 1, AdaptiveConfig())
    set_rates(chain, {(d, 0): a for d, a in [(1, 0.6), (2, 0.5), *((d, 0.5) for d in range(3, 9))]})
    chain.expected_accepted(out)
    assert out[3] == pytest.approx(1.05, abs=1e-4)


def _policy(v: list[float], rates: dict[tuple[int, int], float], width: int = 4) -> TreePolicy:
    policy = TreePolicy(len(v) - 1, width, costs=TableCosts(v))
    set_rates(policy.trees, rates)
    policy._verified = 1  # past min_drafting: k = 0 may win
    return policy


SIBLINGS = {**{(d, 0): 0.6 for d in range(1, 17)}, **{(d, 1): 0.25 for d in range(1, 17)},
            **{(d, 2): 0.1 for d in range(1, 17)}}


def test_a_steep_verify_shrinks_the_tree_to_a_chain() -> None:
    policy = _policy(STEEP, SIBLINGS)
    nodes = policy.best(0)
    assert 1 <= nodes <= 2 and policy.trees.shape(nodes).width == 1  # each row costs half a step: a short chain
    # all drafts rejected: the target alone
    assert _policy(STEEP, {(d, r): 0.0 for d in range(1, 17) for r in range(4)}).best(0) == 0


def test_a_flat_verify_with_siblings_accepted_grows_a_wide_tree() -> None:
    policy = _policy(FLAT, SIBLINGS)
    nodes = policy.best(0)
    assert nodes >= 12 and policy.trees.shape(nodes).width >= 3
    # the same flat costs with siblings never right: a deep chain, no wider
    chain = _policy(FLAT, {(d, 0): 0.6 for d in range(1, 17)})
    assert chain.trees.shape(chain.best(0)).width == 1


def _rank_zero(rates: dict[tuple[int, int], float]) -> TreeAcceptance:
    """A chain's model (width 1) with the rank-0 rates of `rates`: adaptive k's acceptance."""
    model = TreeAcceptance(8, 1, AdaptiveConfig())
    set_rates(model, {key: a for key, a in rates.items() if key[1] == 0})
    return model


def _estimates(policy: TreePolicy, chain_model: TreeAcceptance, costs: TableCosts
               ) -> tuple[list[float], list[float], list[float]]:
    """E[accepted | T] of the policy's trees and of the chain model, and the step times, T in 0..8."""
    tree_tokens, chain_tokens, times = [0.0] * 9, [0.0] * 9, [0.0] * 9
    policy.trees.expected_accepted(tree_tokens)
    chain_model.expected_accepted(chain_tokens)
    costs.step_times(times)
    return tree_tokens, chain_tokens, times


def test_trees_never_rate_below_chains() -> None:
    """For random costs (steep to flat, draft costs) and acceptance, the tree policy's best rate is at least adaptive k
    over chains' with the same rank-0 acceptance and costs (a chain of T nodes is one of the trees of T nodes)."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        slope, d = rng.uniform(0.0, 0.6), rng.uniform(0.0, 0.5)
        v = [1.0 + slope * t for t in range(9)]
        rates = {(dd, r): rng.uniform(0.0, 0.9) * (1.0 - 0.3 * r) / (r + 1) for dd in range(1, 9) for r in range(3)}
        policy = TreePolicy(8, 3, costs=TableCosts(v, d))
        set_rates(policy.trees, rates)
        chain = AdaptiveK(8, costs=TableCosts(v, d))
        chain_model = _rank_zero(rates)
        tree_tokens, chain_tokens, times = _estimates(policy, chain_model, TableCosts(v, d))
        best_tree = max((1 + tree_tokens[t]) / times[t] for t in range(9))
        best_chain = max((1 + chain_tokens[t]) / times[t] for t in range(9))
        assert best_tree >= best_chain - 1e-12
        assert all(a >= b - 1e-12 for a, b in zip(tree_tokens, chain_tokens, strict=True))
        assert chain.k_max == policy.k_max


def test_the_policy_sets_the_steps_shape() -> None:
    class State:
        tree: TreeShape | None = None

    state = State()
    policy = TreePolicy(8, 4, costs=PriorCosts(0.0))
    nodes = policy.next_k(state)  # type: ignore[arg-type]  # only state.tree is written
    assert nodes == policy.best(0) and state.tree == policy.trees.shape(nodes)
    fixed = FixedTree(6, 2)
    assert fixed.next_k(state) == 6 and fixed.k_max == 6  # type: ignore[arg-type]
    assert state.tree is not None and state.tree.width <= 2


def test_siblings_seen_widen_the_next_trees() -> None:
    """Observed steps where the second root child is accepted: the rank-1 rate rises and the best tree of 4 widens."""
    policy = TreePolicy(8, 3, costs=TableCosts(FLAT[:9]))
    assert policy.trees.shape(2).width == 1  # the prior: a sibling (0.21) below the second node of a chain (0.49)
    for _ in range(30):
        policy.observe(4, 1, 1.0, 0.0, tree=tree([-1, -1, 0, 1], [1]))  # the root's second child, every time
    assert policy.trees.shape(2).width == 2


@pytest.mark.parametrize("width", [1, 2, 4])
def test_greedy_with_the_tree_policy_is_the_target_alone(width: int) -> None:
    t = table(10, 2, sharp=1.0)
    prompt = [int(x) for x in np.random.default_rng(5).integers(0, 10, 40)]
    want = greedy_reference(t, prompt, 40, frozenset())
    for policy in (TreePolicy(6, width), FixedTree(6, width)):
        state, _ = run(bigram_backend(t, t), prompt, 40, policy, drafter=NgramDrafter(NgramConfig(1, 3, width=width)),
                       max_len=128)
        assert state.out == want and state.stats.proposed > 0


def test_a_budget_barely_better_is_not_taken() -> None:
    """Rates within the margin (3 %) of the best: the smallest such budget (the smaller bet), not the best by a hair."""
    rates = {(1, 0): 0.6, **{(d, 0): 0.03 for d in range(2, 17)}}  # a second node adds 0.018 tokens for 0.01 more time
    policy = _policy(FLAT, rates)
    tokens, times = [0.0] * 17, [0.0] * 17
    policy.trees.expected_accepted(tokens)
    policy.costs.step_times(times)
    by_rate = max(range(17), key=lambda t: (1 + tokens[t]) / times[t])
    assert by_rate == 2 and policy.best(0) == 1
    policy.margin = 0.0
    assert policy.best(0) == by_rate


def test_a_request_starts_from_the_packs_tree_acceptance() -> None:
    """As for chains (test_adaptive_k.py): a request's per-(depth, rank) rates are shrunk toward the pack's, so two
    rejected root children after requests that accepted most leave a(1, 0) near the pack's rate, where the request's
    own estimate (a flat prior worth one step) falls near zero; a sibling's rate follows the pack's too."""
    config = AdaptiveConfig()
    pooled = TreeAcceptance(4, 2, config, decay=config.pack_decay)
    tree = TreeStep(parents=np.array([-1, -1, 0]), path=np.array([1]))  # root children 0 (rejected), 1 (accepted)
    for _ in range(30):  # earlier requests: the first choice accepted 3 steps in 4, else its sibling
        for _ in range(3):
            pooled.observe(2, 2)
        pooled.observe(3, 1, tree)
    shrunk, alone = TreeAcceptance(4, 2, config, pack=pooled), TreeAcceptance(4, 2, config)
    for acceptance in (shrunk, alone):
        acceptance.observe(2, 0)
        acceptance.observe(1, 0)
    got, own = shrunk.rates(), alone.rates()
    assert own[0][0] < 0.1 and 0.4 < got[0][0] < 0.75
    assert got[0][1] > 0.9 and own[0][1] < 0.25  # the sibling: the pack's rate (the request saw none), or the prior's


def test_an_uninformed_pack_gives_the_trees_flat_prior() -> None:
    config = AdaptiveConfig()
    pooled = TreeAcceptance(4, 2, config, decay=config.pack_decay)
    shrunk, alone = TreeAcceptance(4, 2, config, pack=pooled), TreeAcceptance(4, 2, config)
    for acceptance in (shrunk, alone):
        acceptance.observe(3, 1)
    assert not pooled.informed() and shrunk.rates() == alone.rates()


def _chain_first(v: list[float], rates: dict[tuple[int, int], float], chain_max: int, d: float = 0.0) -> TreePolicy:
    policy = TreePolicy(len(v) - 1, 4, costs=TableCosts(v, d), chain_max=chain_max)
    set_rates(policy.trees, rates)
    policy._verified = 1
    return policy


def test_where_a_tree_is_not_clearly_better_the_chain_adaptive_k_takes_is_drafted() -> None:
    """With the pack's chains (chain_max), a tree is taken only above the margin over the best chain; otherwise the
    step is adaptive k's chain: its k (the highest chain rate, the smaller on a tie) and no tree shape (state.tree
    None: drafted and verified as a chain). Over random costs and acceptance, both ways, against adaptive k with the
    same rank-0 acceptance and costs."""

    class State:
        tree: TreeShape | None = TreeShape(2, 2)

    rng = np.random.default_rng(4)
    chains = trees = 0
    for i in range(300):
        slope, d = rng.uniform(0.0, 0.6 if i % 2 else 0.05), rng.uniform(0.0, 0.3 if i % 2 else 0.02)
        v = [1.0 + slope * t for t in range(9)]
        rates = {(dd, r): rng.uniform(0.0, 0.95) * (1.0 - 0.3 * r) / (r + 1) for dd in range(1, 9) for r in range(4)}
        policy = _chain_first(v, rates, chain_max=4, d=d)
        chain_model = _rank_zero(rates)
        adaptive = AdaptiveK(4, costs=TableCosts(v[:5], d), acceptance=chain_model)
        adaptive._verified = 1
        tokens, chain_tokens, times = _estimates(policy, chain_model, TableCosts(v, d))
        best_tree = max((1 + tokens[t]) / times[t] for t in range(9))
        best_chain = max((1 + chain_tokens[t]) / times[t] for t in range(5))
        state = State()
        nodes = policy.next_k(state)  # type: ignore[arg-type]  # only state.tree is written
        if best_tree < 1.03 * best_chain:
            chains += 1
            assert nodes == adaptive.best(0) and state.tree is None
        else:
            trees += 1
            assert state.tree is not None and (1 + tokens[nodes]) / times[nodes] >= 1.03 * best_chain - 1e-12
    assert chains > 50 and trees > 50  # both ways were tried


def test_a_steep_verify_drafts_a_chain_and_a_flat_one_a_tree() -> None:
    """The real pair's case on two cores (each row half a step: a short chain, as adaptive k would draft it) and a GPU's
    (flat rows, siblings accepted a quarter of the time: a wide tree) with the pack's chains beside the trees."""

    class State:
        tree: TreeShape | None = None

    steep, flat = _chain_first(STEEP, SIBLINGS, chain_max=4), _chain_first(FLAT, SIBLINGS, chain_max=4)
    state = State()
    assert 1 <= steep.next_k(state) <= 2 and state.tree is None  # type: ignore[arg-type]
    nodes = flat.next_k(state)  # type: ignore[arg-type]
    assert nodes >= 12 and state.tree is not None and state.tree.width >= 3

