"""Prompt-lookup (n-gram) drafting: drafts copied from the context itself, no draft model (docs/architecture.md,
"Drafters").

The drafts continue the latest earlier occurrence of the last n tokens of the context (the prompt and every
token committed since), n tried from n_max down to n_min, up to k tokens and at most up to the present (the
copied tokens are all committed ones). Code edits, summaries and retrieval-augmented answers repeat their
input, which is where this pays; elsewhere it proposes little or nothing, and a step with no proposal is a
plain target step. Where a tree policy sets the step's shape (`state.tree`: tree_policy.py), the continuations
of up to `width` earlier occurrences are merged into a token tree (ngram_trie.py), verified in one target pass
(docs/trees.md). The proposal is deterministic (q None): the verify treats it as q one-hot on each token, so the
acceptance test stays exact under sampling.

Per cache slot an NgramIndex (ngram_index.py) takes the committed tokens as they arrive: O(n_max) per token,
a few dict lookups per proposal, never a rescan of the context.

    peers: vLLM (prompt_lookup_min..max, the longest n first, the earliest occurrence, a rescan per step),
    transformers' prompt_lookup (n 2..1, the earliest occurrence, 10 tokens), llama.cpp's ngram-simple
    (one n, 12, the latest occurrence, 48 tokens). The defaults (n 2..4) against other n ranges, replayed on
    the real pair's greedy outputs: bench/README.md, "Drafters and adaptive k" (one prompt so far).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specpack.errors import SpecpackError
from specpack.runtime.ngram_index import NgramIndex
from specpack.runtime.ngram_trie import continuation_trie
from specpack.runtime.state import DecodeState, Proposal

N_LIMIT = 32  # the longest n-gram an index is built for


@dataclass(frozen=True)
class NgramConfig:
    n_min: int = 2   # the shortest suffix looked up (1: any repeated token is a match)
    n_max: int = 4   # the longest suffix looked up, tried first
    width: int = 4   # the most earlier occurrences merged into a token tree (ngram_trie.py), where the pack verifies
                     # trees and the request's `tree` is not "off"; the tree policy picks the width up to it

    def __post_init__(self) -> None:
        for what, n in (("n_min", self.n_min), ("n_max", self.n_max), ("width", self.width)):
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= N_LIMIT:
                raise SpecpackError(f"invalid n-gram {what}", expected=f"an integer in 1..{N_LIMIT}", found=repr(n))
        if self.n_min > self.n_max:
            raise SpecpackError("invalid n-gram range", expected="n_min <= n_max",
                                found=f"n_min {self.n_min}, n_max {self.n_max}")


class NgramDrafter:
    """Drafts from the context: the Drafter protocol, q None. One index per cache slot, reset by `begin`."""

    def __init__(self, config: NgramConfig | None = None) -> None:
        self.config = config or NgramConfig()
        self._indexes: dict[int, NgramIndex] = {}  # cache slot -> its request's index

    def begin(self, state: DecodeState) -> None:
        index = self._indexes.get(state.slot)
        if index is None:
            index = self._indexes[state.slot] = NgramIndex(self.config.n_min, self.config.n_max)
        index.reset()
        index.extend(state.ids, state.length)  # the prompt and the first token: part of the first token's time

    def propose(self, state: DecodeState, k: int) -> Proposal:
        index, ids, start = self._indexes[state.slot], state.ids, state.length
        index.extend(ids, start)  # tokens committed since (steps with k = 0 call no commit)
        shape = state.tree
        if shape is not None:  # a tree policy's step: a trie of several occurrences' continuations, k nodes at most
            width = min(shape.width, self.config.width)
            tokens, parents = continuation_trie(ids, index.matches(width), start, k, state.eos_ids, shape.depth)
            ids[start : start + len(tokens)] = tokens
            return Proposal(tokens=ids[start : start + len(tokens)], q=None, parents=np.asarray(parents, np.int64))
        end, _ = index.match()
        n = 0
        if end >= 0:
            limit = min(k, start - end)  # copy committed tokens only
            while n < limit:
                ids[start + n] = token = ids.item(end + n)
                n += 1
                if token in state.eos_ids:  # nothing after an eos is ever emitted: stop drafting there
                    break
        return Proposal(tokens=ids[start : start + n], q=None)

    def commit(self, state: DecodeState) -> None:
        self._indexes[state.slot].extend(state.ids, state.length)
