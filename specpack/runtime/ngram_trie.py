"""Several prompt-lookup continuations merged into one token tree (docs/trees.md, "Tree drafters").

    tokens, parents = continuation_trie(ids, ends, start, budget, eos_ids, depth)

Each earlier occurrence of the context's suffix (an end e, NgramIndex.matches) proposes the tokens that followed it,
ids[e : start] at most (committed tokens only), cut after an eos and after `depth` tokens (0: the budget). The
continuations are merged into a trie (equal prefixes share nodes), and the nodes are chosen best first: a node's
children enter the frontier once it is chosen, and the frontier's best is the node the most occurrences pass through,
the latest occurrence breaking ties, until `budget` nodes. The chosen order is topological (a parent before its
children): node i's parent is -1 (the root, the last committed token) or an earlier node.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np


def continuation_trie(ids: np.ndarray, ends: Sequence[int], start: int, budget: int,
                      eos_ids: frozenset[int], depth: int = 0) -> tuple[list[int], list[int]]:
    """(tokens, parents) of at most `budget` nodes, from the continuations after each end in `ends` (latest first),
    each at most `depth` tokens long (0: `budget`)."""
    length = min(depth, budget) if depth > 0 else budget
    children: dict[int, dict[int, int]] = {-1: {}}  # trie node -> {token: child}
    token_of: list[int] = []
    count: list[int] = []
    latest: list[int] = []  # the latest end through the node (higher: more recent)
    for end in ends:
        node = -1
        for pos in range(end, min(end + length, start)):
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
    frontier = [(-count[c], -latest[c], c, -1) for c in children[-1].values()]  # (-count, -recency, trie node, parent)
    heapq.heapify(frontier)
    while frontier and len(tokens) < budget:
        _, _, node, parent = heapq.heappop(frontier)
        index = len(tokens)
        tokens.append(token_of[node])
        parents.append(parent)
        for c in children[node].values():
            heapq.heappush(frontier, (-count[c], -latest[c], c, index))
    return tokens, parents
