"""A token tree drafted by a draft head or a draft model, EAGLE-2's way (arXiv 2406.16858; docs/heads.md, "Trees
drafted by the head"; docs/trees.md, "Trees drafted by the draft model").

    tokens, parents = head_tree(step, committed, budget, width, depth, eos_ids)

Depth by depth: the catch-up's last row gives the root's top-`width` children (depth 1); at each further depth the
`width` nodes of the newest depth with the highest cumulative log-probability (the sum of the head's log-probabilities
along the root path) are expanded, one head row each, reading the committed rows and its ancestors' rows only, and each
gives its own top-`width` children. After the last depth every drafted node is ranked by cumulative log-probability
(ties: the earlier drafted first) and the best `budget` are kept: a child's score never exceeds its parent's and a
parent is drafted before its children, so the kept set holds every kept node's ancestors. They are emitted in the order
drafted, which is topological (parents[i] < i, -1: the root).

`step` is the drafter's tree step (engine.TreeDraftEngine.tree_step over one request): a head's (its rows read the
committed rows from target features) or a draft model's (`committed` is then the committed length, so a run's position
is the root's + the nodes' depth). The candidates are the head's (model's) top-w under its own distribution, a
deterministic function of the context (the committed tokens, and a head's target features): the verify's
deterministic rule is exact for them (docs/trees.md, "The rule").
Expansions stop at an eos (nothing after it is emitted) and when `budget` rows were run (a tree of `budget` nodes has
fewer inner nodes), so the head's rows fit its cache wherever the verify's fit the target's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from specpack.runtime.engine import HeadTreeRun, TopRows


class _Node(NamedTuple):
    token: int
    parent: int             # a node index, -1: the root
    score: float            # cumulative log-probability under the head
    depth: int
    hidden: int             # where the output of the row that predicted it is kept (its expansion's hidden_in)
    ancestors: tuple[int, ...]  # the head cache rows of its expanded ancestors


def head_tree(step: Callable[[HeadTreeRun | None], TopRows], committed: int, budget: int, width: int, depth: int,
              eos_ids: frozenset[int]) -> tuple[list[int], list[int]]:
    """(tokens, parents) of at most `budget` nodes, at most `width` children a node and `depth` levels; `step` runs
    the head (None: the catch-up; its rows [0, committed) are the committed ones)."""
    nodes: list[_Node] = []
    top = step(None)
    _add_children(nodes, top, 0, -1, 0.0, 1, (), width)
    frontier = list(range(len(nodes)))
    rows_run = 0
    for level in range(2, depth + 1):
        expand = [i for i in frontier if nodes[i].token not in eos_ids][: budget - rows_run]
        if not expand:
            break
        run = HeadTreeRun(tokens=np.array([nodes[i].token for i in expand], np.int64),
                          hidden=np.array([nodes[i].hidden for i in expand], np.int64),
                          position=committed + level - 2, committed=committed,
                          ancestors=np.array([nodes[i].ancestors for i in expand], np.int64).reshape(len(expand),
                                                                                                     level - 2))
        top = step(run)
        rows_run += len(expand)
        first = len(nodes)
        for j, i in enumerate(expand):
            _add_children(nodes, top, j, i, nodes[i].score, level, (*nodes[i].ancestors, int(top.rows[j])), width)
        frontier = sorted(range(first, len(nodes)), key=lambda n: (-nodes[n].score, n))[:width]
    kept = sorted(sorted(range(len(nodes)), key=lambda n: (-nodes[n].score, n))[:budget])
    index = {node: i for i, node in enumerate(kept)}
    return [nodes[n].token for n in kept], [-1 if nodes[n].parent < 0 else index[nodes[n].parent] for n in kept]


def _add_children(nodes: list[_Node], top: TopRows, row: int, parent: int, score: float, level: int,
                  ancestors: tuple[int, ...], width: int) -> None:
    """Row `row` of `top`'s best `width` tokens as children of `parent` (log-probabilities clamped at 0, so that a
    child never outranks its parent)."""
    for token, logprob in zip(top.tokens[row, :width].tolist(), top.logprobs[row, :width].tolist(), strict=True):
        nodes.append(_Node(int(token), parent, score + min(float(logprob), 0.0), level, int(top.hidden[row]),
                           ancestors))
