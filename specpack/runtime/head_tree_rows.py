"""The host side of a tree-form step's runs: a draft head's (docs/heads.md, "Trees drafted by the head") or a draft
model's (docs/trees.md, "Trees drafted by the draft model"), shared by the cpu backend (which binds these arrays) and the
cuda backend (which uploads the inputs and reads the outputs back into them).

    HeadTreeBuffers     per slot: own rows' positions, mask and (a head's) hidden_in; every run's top-K tokens,
                        log-probabilities and (a head's) row outputs o of the tree being drafted (a later run's
                        hidden_in gathers from them); a draft model has no row outputs (hidden 0)
    draft_tree_buffers  a pack's draft model's HeadTreeBuffers, where it has the tree form
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from specpack import names
from specpack.runtime.engine import HeadTreeRun, TopRows

if TYPE_CHECKING:
    from specpack.contract.manifest import Manifest


def draft_tree_buffers(m: Manifest, slots: int) -> HeadTreeBuffers | None:
    """The host buffers of a draft model's tree runs (its tree form on a tree pack: the manifest's draft tree_width;
    runs: the catch-up and the deepest tree's expansions); None: it drafts chains."""
    tree, draft = m.target.graph.tree, m.draft_model
    if tree is None or draft is None or not draft.tree_width:
        return None
    return HeadTreeBuffers(slots, draft.tree_width, tree.max_nodes + 1, m.max_len)


class HeadTreeBuffers:
    """Per slot, what a tree-form head binds besides a chain head's (docs/heads.md, "Trees drafted by the head"): own
    rows' positions and mask, and each run's top-K tokens, log-probabilities and row outputs o, kept for the whole tree
    (a later run's hidden_in gathers from them)."""

    def __init__(self, slots: int, width: int, max_runs: int, max_len: int, hidden: int = 0,
                 dtype: np.dtype | type = np.float32) -> None:
        """width: K (the graph's TopK, the widest expansion); max_runs: the catch-up + the deepest tree's expansions;
        hidden: a head's H (0: a draft model, whose rows read its own KV cache only)."""
        self.width, self.rows_per_run, self.max_len, self.hidden_size = width, width + 1, max_len, hidden
        r = width + 1  # a run's output rows: W own rows then the last (W <= K)
        self.tokens = [np.zeros((max_runs, r, width), np.int64) for _ in range(slots)]      # [runs, W+1, K]
        self.logprobs = [np.zeros((max_runs, r, width), np.float32) for _ in range(slots)]  # [runs, W+1, K]
        self.hidden = [np.zeros((max_runs * r, hidden), dtype) for _ in range(slots)]        # [runs * (W+1), H]
        self.hidden_in = [np.zeros((1, width, hidden), dtype) for _ in range(slots)]         # [1, K, H]
        self.positions = [np.zeros((1, width), np.int64) for _ in range(slots)]              # [1, K]
        self.mask = [np.zeros((1, width, max_len), np.bool_) for _ in range(slots)]          # [1, K, M]
        self.all_rows = np.ones((1, 1, max_len), np.bool_)                                   # [1, 1, M] a chain's
        self.runs = [0] * slots                                                               # the tree's last run

    def chain_inputs(self, slot: int, first: int, w: int) -> dict[str, np.ndarray]:
        """W <= 1 own rows of a chain (or none): at their cache rows from `first`, reading every row before them."""
        positions = self.positions[slot][:, :w]
        positions[0] = first + np.arange(w)
        return {names.DRAFT_POSITIONS: positions, names.DRAFT_MASK: self.all_rows[:, :w]}

    def own_inputs(self, slot: int, run: HeadTreeRun, start: int) -> dict[str, np.ndarray]:
        """A head's tree run's own rows (cache rows start ..): the nodes' tokens, their predicting rows' outputs, and
        row_inputs."""
        w = len(run.tokens)
        hidden_in = self.hidden_in[slot][:, :w]
        hidden_in[0] = self.hidden[slot][run.hidden]  # [W, H] gathered
        return {names.DRAFT_IDS: run.tokens[None], names.HIDDEN_IN: hidden_in, **self.row_inputs(slot, run, start)}

    def row_inputs(self, slot: int, run: HeadTreeRun, start: int) -> dict[str, np.ndarray]:
        """A tree run's own rows (cache rows start ..): their position and mask (the committed rows, the ancestors'
        rows, its own)."""
        w = len(run.tokens)
        positions, mask = self.positions[slot][:, :w], self.mask[slot][:, :w]
        positions[0] = run.position
        mask[:] = False
        mask[0, :, : run.committed] = True
        mask[0, np.arange(w)[:, None], run.ancestors] = True  # [W, d - 1]
        mask[0, np.arange(w), start + np.arange(w)] = True  # each row's own
        return {names.DRAFT_POSITIONS: positions, names.DRAFT_MASK: mask}

    def outputs(self, slot: int, index: int, w: int) -> dict[str, np.ndarray]:
        """Run `index`'s outputs: W + 1 rows of top-K tokens, log-probabilities and (a head's) outputs o."""
        r = self.rows_per_run
        out: dict[str, np.ndarray] = {names.TREE_TOKENS: self.tokens[slot][index : index + 1, : w + 1],
               names.TREE_LOGPROBS: self.logprobs[slot][index : index + 1, : w + 1]}
        if self.hidden_size:
            out[names.TREE_HIDDEN] = self.hidden[slot][None, index * r : index * r + w + 1]
        return out

    def next_run(self, slot: int, run: HeadTreeRun | None) -> int:
        """The index of the tree's next run on `slot` (0: the catch-up, which starts a new tree)."""
        self.runs[slot] = 0 if run is None else self.runs[slot] + 1
        return self.runs[slot]

    def top_rows(self, slot: int, index: int, w: int, first: int) -> TopRows:
        """What run `index` gave (its outputs are in these buffers): W own rows from cache row `first`, or (W = 0) the
        catch-up's last row, at `first`."""
        r = max(w, 1)
        return TopRows(self.tokens[slot][index, :r].copy(), self.logprobs[slot][index, :r].copy(),
                       index * self.rows_per_run + np.arange(r), first + np.arange(r))
