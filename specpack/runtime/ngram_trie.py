"""Several prompt-lookup continuations merged into one token tree (docs/trees.md, "Tree drafters").

    tokens, parents = continuation_trie(ids, ends, start, budget, eos_ids, depth)

Each earlier occurrence of the context's suffix (an end e, NgramIndex.matches) proposes the tokens that followed it,
ids[e : start] at most (committed tokens only), cut after an eos. The continuations are merged into a trie (equal
prefixes share nodes), and the nodes are chosen best first: a node's children enter the frontier once it is chosen,
and the frontier's best is the node the most occurrences pass through, the latest occurrence breaking ties, until
`budget` nodes; nodes deeper than `depth` (the tree policy's shape) come after every shallower one, so they fill a
budget the occurrences cannot fill within the shape (a trie with no sibling to offer goes deeper instead). The chosen
order is topological (a parent before its children): node i's parent is -1 (the root, the last committed token) or
an earlier node.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np


def continuation_trie(ids: np.ndarray, ends: Sequence[int], start: int, budget: int,
                      eos_ids: frozenset[int], depth: int = 0) -> tuple[list[int], list[int]]:
    """(tokens, parents) of at most `budget` nodes, from the continuations after each end in `ends` (latest first);
    nodes deeper than `depth` (0: no limit) only fill what the shallower ones leave of the budget."""
    children: dict[int, dict[int, int]] = {-1: {}}  # trie node -> {token: child}
    token_of: list[int] = []
    count: list[int] = []
    latest: list[int] = []  # the latest end through the node (higher: more recent)
    for end in ends:
        node = -1
        for pos in range(end, min(end + budget, start)):
            token = ids.item(pos)
            child = children[node].get(token)
            if child is None:
                child = children[node][token] = len(token_of)
                children[child] = {}
                token_of.append(token)
                count.append(0)
                latest.append(end)
            count[child] += 1
            latest[child] = max(latest[child], end)
            node = child
            if token in eos_ids:  # nothing after an eos is ever emitted
                break
    tokens: list[int] = []
    parents: list[int] = []
    limit = depth if depth > 0 else budget
    # (beyond the depth, -count, -recency, trie node, its depth, parent)
    frontier = [(False, -count[c], -latest[c], c, 1, -1) for c in children[-1].values()]
    heapq.heapify(frontier)
    while frontier and len(tokens) < budget:
        _, _, _, node, level, parent = heapq.heappop(frontier)
        index = len(tokens)
        tokens.append(token_of[node])
        parents.append(parent)
        for c in children[node].values():
            heapq.heappush(frontier, (level + 1 > limit, -count[c], -latest[c], c, level + 1, index))
    return tokens, parents
