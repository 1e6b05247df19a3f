"""Tree size policy (`tree="auto"`): each step's node budget, and the tree's width and depth, chosen from the acceptance
seen per (depth, sibling rank) and the step costs measured on this machine (docs/trees.md, "Tree size policy").

It is adaptive k (adaptive_k.py) over node budgets T in 0..T_max, with a tree's expected tokens in place of a chain's:

    rate(T) = (1 + E[accepted | T]) / (T d + V(T))
    V(T)  the rest of a step that verified T nodes: MeasuredCosts (or PriorCosts) of adaptive_k.py, unchanged. A tree
          of T nodes and a chain of T drafts are the same verify (T + 1 rows of the tree form), so they share V.
    E[accepted | T] = max over trees t of T nodes of  sum_{v in t} prod_{u on the root path of v} a(depth u, rank u)
    a(d, r) = P(the rank-r child of a node at depth d - 1 is accepted | that node was accepted)
          rank: the child's place among its siblings in the proposal (0: the drafter's first choice). A child is
          accepted only after its earlier siblings are rejected, so sum_r a(d, r) <= 1 and a(d, r) is the marginal
          rate (Sequoia's positional acceptance vector, arXiv 2402.12374, made per depth): the expected accepted
          nodes of a tree are the sum of its nodes' path products, exactly, given these rates (linearity of
          expectation over nodes; each node's acceptance needs every ancestor's).

The best tree of T nodes is the T nodes of the highest path products (EAGLE-2's reranking by value, arXiv 2406.16858:
a child's product never exceeds its parent's, so the top T form a tree): taken best first from the root, a node's
first child and its next sibling entering once it is taken. One pass to T_max gives E[accepted | T] for every T, and
the shape of each best tree: `TreeShape(width = 1 + its highest rank, depth = its deepest node)`, what the drafter is
asked for (the n-gram trie: earlier occurrences merged, nodes past the depth only where the budget is left unused).
With rank 0 alone this is
adaptive k's chain model exactly (a chain is a tree of width 1; tested), so the policy never expects fewer tokens from
a budget than a chain of it would give, at the same cost: where verify rows are expensive (the CPU) it settles on a
small budget, and on a chain unless a sibling is worth more than the chain's next node.

Acceptance (TreeAcceptance): decayed counts per (depth, rank), `reached` (the node's parent was accepted, or it is a
root child) and `passed` (it was accepted), with AcceptanceModel's decay and idle memory, shrunk per rank as
AcceptanceModel shrinks per position: toward the rank's pooled rate over all depths, itself shrunk toward a prior
    prior(r) = p0 (1 - p0)^r        (each sibling takes the share p0 of what the earlier ones left)
    pool(r)  = (sum_d passed(d, r) + w prior(r)) / (sum_d reached(d, r) + w)
    a(d, r)  = (passed(d, r) + w a(d - 1, r)) / (reached(d, r) + w),   a(0, r) from pool(r)
As for chains (adaptive_k.PackAcceptance), a pack keeps these counts over its requests with a long memory
(`pack_decay`), and a request's rates are shrunk toward the pack's at the same (depth, rank), worth `pack_weight` steps,
once the pack has seen that many root children (not for seeded sampling: Pack.policy).
Every threshold, probe and neighbour of AdaptiveK applies to T unchanged (AdaptiveConfig), with one change: `best`
takes the smallest budget whose rate is within MARGIN (3 %) of the highest, the smaller bet where the model barely
tells budgets apart (a large tree rejected at its first node costs V(T) for one token; replayed on the CPU's int4
costs, no margin lost 1-2 % against adaptive chains, 3 % broke even: docs/trees.md, "Measured"). Seeded sampling uses
PriorCosts (pack.py), so the T schedule and the shapes follow acceptance alone, never the clock.
Chains first (`chain_max`, a pack's k_max: it verifies chains too): the best chain of 0..chain_max drafts by the
same rates (rank 0 alone) and costs is what adaptive k would take; a step drafts it as a chain (`state.tree` None:
the chain's drafting and verify, no tree runs) unless the best tree's estimated rate is above the chain's by MARGIN,
and then the smallest budget that is. The model prices a tree's drafting and verify as a chain's of as many nodes,
which trees cost more than (their top-K read back, kv_compact after the verify): so a tree must win by more than a
hair (measured on the CPU, docs/trees.md, "Tree size policy"; a table of the trees' own step times, tried, drafted
less on the CPU, not kept).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np

from specpack.runtime.adaptive_k import AdaptiveConfig, AdaptiveK, Costs, highest_rate
from specpack.runtime.state import DecodeState, TreeShape, TreeStep

CHAIN = TreeShape(width=1, depth=0)  # the shape of an empty budget
MARGIN = 0.03  # a budget within this fraction of the best estimated rate is as good: the smallest such is taken


class TreeAcceptance:
    """Decayed per-(depth, rank) counts -> E[accepted | T] and the best tree's shape for every T (module docstring)."""

    def __init__(self, nodes_max: int, max_width: int, config: AdaptiveConfig, pack: TreeAcceptance | None = None,
                 decay: float | None = None) -> None:
        """pack: the rates pooled over the pack's requests (a TreeAcceptance of `pack_decay`), which a request's are
        shrunk toward once it has seen `pack_weight` root children (adaptive_k.PackAcceptance's rule, per (depth,
        rank)); this request's observations go there too."""
        self.config, self.nodes_max, self.max_width = config, nodes_max, max_width
        self.pack = pack
        self.decay = config.decay if decay is None else decay
        self.reached = np.zeros((nodes_max, max_width))  # [T_max, W] decayed: parent accepted (depth d + 1, rank r)
        self.passed = np.zeros((nodes_max, max_width))   # [T_max, W] ... and the node accepted too
        self._age = 0                                     # steps since the counts last decayed
        self._tokens = [0.0] * (nodes_max + 1)            # [T_max+1] E[accepted | T], valid while _fresh
        self._chain = [0.0] * (nodes_max + 1)             # [T_max+1] E[accepted | a chain of T], valid while _fresh
        self._shapes = [CHAIN] * (nodes_max + 1)          # [T_max+1] the best tree's shape, valid while _fresh
        self._fresh = False

    def observe(self, k: int, n_accepted: int, tree: TreeStep | None = None) -> None:
        """A step that verified k nodes: a chain (tree None: drafts 0..n-1 accepted) or a tree (its accepted path)."""
        if self.pack is not None:
            self.pack.observe(k, n_accepted, tree)
        self._age += 1
        if k == 0:  # nothing verified: as AcceptanceModel, the counts age by idle_memory steps at most
            return
        self._fresh = False
        decay, self._age = self.decay ** min(self._age, self.config.idle_memory), 0
        self.reached *= decay
        self.passed *= decay
        if tree is None:
            for i in range(min(n_accepted + 1, k, self.nodes_max)):
                self.reached[i, 0] += 1.0
                self.passed[i, 0] += i < n_accepted
            return
        accepted = set(tree.path.tolist())
        depth = [0] * k                     # [k] depth - 1 of each node
        children: dict[int, int] = {}       # node (-1: root) -> children seen so far: the next child's rank
        for i, parent in enumerate(tree.parents.tolist()):
            depth[i] = 0 if parent < 0 else depth[parent] + 1
            rank = children.get(parent, 0)
            children[parent] = rank + 1
            if rank < self.max_width and (parent < 0 or parent in accepted):
                self.reached[depth[i], rank] += 1.0
                self.passed[depth[i], rank] += i in accepted

    def informed(self) -> bool:
        """Whether these counts hold `pack_weight` root children's worth (a pack's, before requests shrink toward it)."""
        return bool(self.reached[0, 0] >= self.config.pack_weight)

    def rates(self) -> list[list[float]]:
        """a[d][r]: the shrunk acceptance rate of a rank-r child at depth d + 1 (module docstring), or, with an informed
        pack, this request's counts shrunk toward the pack's rate at the same (depth, rank)."""
        reached, passed = self.reached.tolist(), self.passed.tolist()
        if self.pack is not None and self.pack.informed():
            w, pooled = self.config.pack_weight, self.pack.rates()
            return [[(passed[d][r] + w * pooled[d][r]) / (reached[d][r] + w) for r in range(self.max_width)]
                    for d in range(self.nodes_max)]
        w, p0 = self.config.prior_weight, self.config.prior_acceptance
        a = [[0.0] * self.max_width for _ in range(self.nodes_max)]
        for r in range(self.max_width):
            h = (float(self.passed[:, r].sum()) + w * p0 * (1.0 - p0) ** r) / (float(self.reached[:, r].sum()) + w)
            for d in range(self.nodes_max):
                h = (passed[d][r] + w * h) / (reached[d][r] + w)
                a[d][r] = h
        return a

    def expected_accepted(self, out: list[float]) -> None:
        """out[T] = E[accepted | T] for T in 0..T_max, the best tree of T nodes (out has T_max + 1 entries)."""
        self._update()
        out[:] = self._tokens

    def chain_accepted(self, out: list[float]) -> None:
        """out[T] = E[accepted | a chain of T drafts] (rank 0 alone: adaptive k's model), T in 0..T_max."""
        self._update()
        out[:] = self._chain

    def shape(self, nodes: int) -> TreeShape:
        """The best tree of `nodes` nodes: its width (1 + the highest sibling rank) and depth."""
        self._update()
        return self._shapes[min(nodes, self.nodes_max)]

    def _update(self) -> None:
        """The best trees of 1..T_max nodes, best first from the root (module docstring)."""
        if self._fresh:
            return
        a = self.rates()
        product = 1.0
        for t in range(1, self.nodes_max + 1):  # a chain: the path of first children
            product *= a[t - 1][0]
            self._chain[t] = self._chain[t - 1] + product
        frontier = [(-a[0][0], 0, 0, 1.0)]  # (-path product, depth - 1, rank, the parent's product): the first child
        total, width, depth = 0.0, 1, 0
        for t in range(1, self.nodes_max + 1):
            negative, d, r, parent = heapq.heappop(frontier)
            value = -negative
            total += value
            width, depth = max(width, r + 1), max(depth, d + 1)
            self._tokens[t], self._shapes[t] = total, TreeShape(width, depth)
            if r + 1 < self.max_width:  # its next sibling
                heapq.heappush(frontier, (-parent * a[d][r + 1], d, r + 1, parent))
            if d + 1 < self.nodes_max:  # its first child
                heapq.heappush(frontier, (-value * a[d + 1][0], d + 1, 0, value))
        self._fresh = True


class TreePolicy(AdaptiveK):
    """The KPolicy of `tree="auto"`: the node budget of the highest expected tokens per unit time (AdaptiveK over
    budgets, TreeAcceptance's tokens), and `state.tree` set to the best tree's shape for it; or, with `chain_max`, a
    chain as adaptive k would choose it (`state.tree` None: drafted and verified as a chain) unless a tree's estimated
    rate beats the best chain's by the margin."""

    def __init__(self, nodes_max: int, max_width: int, config: AdaptiveConfig | None = None,
                 costs: Costs | None = None, margin: float = MARGIN, warmups: Callable[[], int] | None = None,
                 pooled: TreeAcceptance | None = None, chain_max: int = 0) -> None:
        """pooled: the pack's tree acceptance over its requests (Pack.policy; None: this request's alone); chain_max:
        the most drafts a chain holds where the pack verifies chains too (its k_max; 0: trees only, width 1 a chain)."""
        config = config or AdaptiveConfig()
        self.trees = TreeAcceptance(nodes_max, max_width, config, pack=pooled)
        self.margin, self.chain_max = margin, min(chain_max, nodes_max)
        super().__init__(nodes_max, config, costs, acceptance=self.trees, warmups=warmups)
        self._chain = [0.0] * (nodes_max + 1)  # [T_max+1] E[accepted | a chain of T]
        self._as_chain = False                 # the last `best` chose a chain (and its neighbours are chains)

    def best(self, low: int = 0) -> int:
        """The smallest budget in low..T_max whose estimated rate is within `margin` of the highest (module docstring:
        the smaller bet where the model barely tells budgets apart); with chains (chain_max), adaptive k's chain
        (the highest rate in low..chain_max, the smaller on a tie) unless a tree's rate is above the margin over it."""
        self.trees.expected_accepted(self._tokens)
        self.costs.step_times(self._times)
        rates = [(1.0 + self._tokens[t]) / self._times[t] if self._times[t] > 0 else float("inf")
                 for t in range(low, self.k_max + 1)]
        top, floor = max(rates), (1.0 - self.margin) * max(rates)
        self._as_chain = False
        if self.chain_max > 0 and low <= self.chain_max:
            self.trees.chain_accepted(self._chain)
            chain, chain_rate = highest_rate(self._chain, self._times, low, self.chain_max)
            if top < (1.0 + self.margin) * chain_rate:  # no tree clearly better: the chain adaptive k would take
                self._as_chain = True
                return chain
            floor = max(floor, (1.0 + self.margin) * chain_rate)
        return low + next(i for i, rate in enumerate(rates) if rate >= floor)

    def next_k(self, state: DecodeState) -> int:
        nodes = super().next_k(state)
        state.tree = None if self._as_chain and nodes <= self.chain_max else self.trees.shape(nodes)
        return nodes

    def observe(self, k: int, n_accepted: int, elapsed_s: float, draft_s: float, *,
                tree: TreeStep | None = None) -> None:
        self.trees.observe(k, n_accepted, tree)
        self._observe_costs(k, elapsed_s, draft_s)


class FixedTree:
    """The KPolicy of `tree=N`: N nodes every step, in the shape TreeAcceptance finds best for N (no clock)."""

    def __init__(self, nodes: int, max_width: int, config: AdaptiveConfig | None = None) -> None:
        self.nodes = nodes
        self.trees = TreeAcceptance(nodes, max_width, config or AdaptiveConfig())

    @property
    def k_max(self) -> int:
        return self.nodes

    def next_k(self, state: DecodeState) -> int:
        state.tree = self.trees.shape(self.nodes)
        return self.nodes

    def observe(self, k: int, n_accepted: int, elapsed_s: float, draft_s: float, *,
                tree: TreeStep | None = None) -> None:
        self.trees.observe(k, n_accepted, tree)
