"""k policies: how many drafts each step asks for (docs/architecture.md, "k policy").

The loop asks `next_k(state)` before every step, caps the answer at the tokens still allowed, and reports
what happened with `observe(k, n_accepted, elapsed_s, draft_s, tree=...)` (tree: the verified tree's parents and
accepted path, None for a chain). k = 0 is a plain autoregressive step through the verify graph. A policy lives
for one request. For a tree drafter k is the node budget, and a tree policy also sets `state.tree` (its shape).

    FixedK      the same k every step (`generate(k=N)`)
    AdaptiveK   the k of the highest expected tokens per second (`generate(k=None)`, "auto"; adaptive_k.py)
    TreePolicy  the node budget and the tree's width and depth, likewise (`generate(tree="auto")`; tree_policy.py)
    FixedTree   the same node budget every step (`generate(tree=N)`; tree_policy.py)
"""

from __future__ import annotations

from typing import Protocol

from specpack.runtime.state import DecodeState, TreeStep


class KPolicy(Protocol):
    @property
    def k_max(self) -> int:
        """The most drafts it will ever ask for (0: never draft, so the draft model is never opened)."""
        ...

    def next_k(self, state: DecodeState) -> int:
        """Drafts for the next step, in 0..k_max."""
        ...

    def observe(self, k: int, n_accepted: int, elapsed_s: float, draft_s: float, *,
                tree: TreeStep | None = None) -> None:
        """The step verified k drafts (after the loop's cap and the drafter's own limits; 0 when it proposed
        nothing), n_accepted passed; it took elapsed_s, of which draft_s drafting (the rest: verify and commit).
        `tree`: the k drafts were a tree's nodes (its parents, the accepted path); None: a chain."""
        ...


class FixedK:
    def __init__(self, k: int) -> None:
        self.k = k

    @property
    def k_max(self) -> int:
        return self.k

    def next_k(self, state: DecodeState) -> int:
        return self.k

    def observe(self, k: int, n_accepted: int, elapsed_s: float, draft_s: float, *,
                tree: TreeStep | None = None) -> None:
        pass
