"""Drafters: who proposes the k tokens a verify checks (docs/architecture.md, "Drafters").

A drafter writes its draft tokens into state.ids right after the committed ones and returns a Proposal:
those tokens, and q, the distributions they were drawn from (a handle the backend's verify reads), or
None for a deterministic proposal (q one-hot on each token: an n-gram or lookup drafter). Any drafter
goes through the same verify, so the output keeps the target's distribution whatever it proposes.

    ModelDrafter   the pack's draft model (draft_step.onnx), on the backend's draft model
    HeadDrafter    the pack's draft head (head_step.onnx: docs/heads.md), on the backend's draft model
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol, cast

import numpy as np

from specpack.runtime.backend import DraftModel, TreeDraftModel
from specpack.runtime.head_tree import head_tree
from specpack.runtime.state import DecodeState, Proposal


class Drafter(Protocol):
    def begin(self, state: DecodeState) -> None:
        """A new request: state.ids[:state.length] are committed (the prompt and the first token).
        Called once, after the target's prefill, and only when the k policy may ask for drafts; it runs nothing (a
        drafter's own prefill is its first proposal's catch-up: the first token never waits for it)."""
        ...

    def propose(self, state: DecodeState, k: int) -> Proposal:
        """Up to k >= 1 draft tokens after the committed ones, written into state.ids[length : length + n]
        (n <= k: fewer when the drafter has no more, or stops at a drafted eos)."""
        ...

    def commit(self, state: DecodeState) -> None:
        """The verify committed state.ids[:state.length]: forget anything drafted past the accepted prefix."""
        ...


class ModelDrafter:
    """The draft model: k draft steps per proposal, each drawing with state.uniforms.draft[i].

    The draft's cache trails the committed tokens: after a step it holds the committed tokens and all but
    the last draft; at the next step it catches up by feeding S >= 1 tokens (S = 2 after all k drafts
    were accepted: the last draft and the bonus token). Its prefill is the first proposal's catch-up (every committed
    token, in one run): nothing of the draft runs before the first token, and a request that never drafts (k 0
    throughout, e.g. capped by a batch) never pays for it.
    Where a tree policy sets the step's shape (state.tree; a tree pack's draft model in its tree form) it drafts
    EAGLE-2's dynamic tree (head_tree.py) instead of a chain: deterministic candidates (q None). A greedy request's
    tree of width 1 within the chain's range (k <= chain_max) is the chain of the draft's argmaxes, drafted as a chain:
    the same tokens, without the tree runs' top-K read back and host-side tree building (docs/trees.md, "Trees drafted
    by the draft model").
    """

    def __init__(self, model: Callable[[], DraftModel], chain_max: int = 0) -> None:
        """model: the backend's `draft` (it opens the draft model on first use: a k = 0 request never calls it);
        chain_max: the most drafts a chain proposal holds (the pack's k_max: the draft's q rows)."""
        self.model = model
        self.chain_max = chain_max
        self._kept: dict[int, int] = {}  # slot -> the draft cache's rows to keep after a tree's verify
        self._fresh: set[int] = set()    # slots whose request has not drafted yet: their cache is reset then

    def begin(self, state: DecodeState) -> None:
        self._kept.pop(state.slot, None)
        self._fresh.add(state.slot)  # the draft's prefill waits for the first proposal (the class docstring)

    def propose(self, state: DecodeState, k: int) -> Proposal:
        if state.slot in self._fresh:  # a request's first proposal: its first run catches up on every committed token
            self._fresh.discard(state.slot)
            self.model().reset(state)
        if self._drafts_tree(state, k):
            self._kept[state.slot] = state.length  # the catch-up's rows: the committed tokens; the tree's go after
            return self._tree(state, k, state.length)
        self._kept.pop(state.slot, None)  # a chain keeps what it always kept
        return self._chain(state, k)

    def _chain(self, state: DecodeState, k: int) -> Proposal:
        model, ids, start = self.model(), state.ids, state.length
        n = 0
        while n < k:
            ids[start + n] = token = model.step(state, end=start + n, row=n)
            n += 1
            if token in state.eos_ids:  # nothing after an eos is ever emitted: stop drafting there
                break
        return Proposal(tokens=ids[start : start + n], q=model.q(state, n))

    def _drafts_tree(self, state: DecodeState, k: int) -> bool:
        """Whether this step drafts a tree: the policy set a shape, and it is not a greedy chain within chain_max."""
        shape = state.tree
        return shape is not None and not (shape.width == 1 and k <= self.chain_max and state.params.greedy)

    def _tree(self, state: DecodeState, k: int, committed: int) -> Proposal:
        """EAGLE-2's dynamic tree of k nodes at most, in the policy's shape (head_tree.py); `committed`: the draft
        cache rows every tree row reads (a model: every committed token; a head: those with target features)."""
        assert state.tree is not None
        model, ids, start = cast(TreeDraftModel, self.model()), state.ids, state.length  # the backend's Draft
        width = min(state.tree.width, model.tree_width)
        tokens, parents = head_tree(partial(model.tree_step, state), committed, k, width, min(state.tree.depth, k),
                                    state.eos_ids)
        ids[start : start + len(tokens)] = tokens
        return Proposal(tokens=ids[start : start + len(tokens)], q=None, parents=np.asarray(parents, np.int64))

    def commit(self, state: DecodeState) -> None:
        # after a chain the next token is not in the draft's cache; after a tree only the rows the catch-up wrote stay
        # (the tree's rows sit past them, in node order: the accepted path is fed again by the next catch-up)
        self.model().rollback(state, self._kept.pop(state.slot, state.length - 1))


class HeadDrafter(ModelDrafter):
    """A draft head (docs/heads.md): it reads the target's features, which the verify writes, so it has no prefill
    of its own; its first step of each proposal catches up on the rows the target has computed since the last one.
    Its cache keeps only rows computed from target features (EAGLE's rule): after the verify the drafted rows go.
    Where a tree policy sets the step's shape (state.tree; a tree pack's head), it drafts EAGLE-2's dynamic tree
    (head_tree.py) instead of a chain, as ModelDrafter does (and a greedy tree of width 1 within chain_max as a chain)."""

    def __init__(self, model: Callable[[], DraftModel], chain_max: int = 0) -> None:
        """chain_max: the most drafts a chain proposal holds (the pack's k_max: the head's q rows)."""
        super().__init__(model, chain_max)
        self._featured: dict[int, int] = {}  # slot -> rows from target features before the drafted ones

    def begin(self, state: DecodeState) -> None:
        self.model().reset(state)  # nothing to run: the first proposal catches up on the prompt's features

    def propose(self, state: DecodeState, k: int) -> Proposal:
        self._featured[state.slot] = state.length - 1  # rows t < length - 1 have target features
        if self._drafts_tree(state, k):
            return self._tree(state, k, state.length - 1)
        return self._chain(state, k)

    def commit(self, state: DecodeState) -> None:
        self.model().rollback(state, self._featured.pop(state.slot))
