"""What one request carries through the loop, and what each stage hands the next (docs/architecture.md).

    DecodeState    one request: its token ids, committed length, sampling parameters and uniforms,
                   stop ids, budget, statistics, and the backend cache slot it uses
    Proposal       the drafter -> the target: k draft tokens (already in state.ids) and q, their distributions
    VerifyResult   the target -> the loop: how many drafts were accepted, and the next token

Nothing is shared between requests: each DecodeState owns its ids and uniforms; the backend's buffers and
caches for a request are picked by `state.slot`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from specpack.runtime.stats import DecodeStats
from specpack.sampling import SamplingParams, Uniforms


@dataclass
class DecodeState:
    """One request (llama2.c's RunState for one sequence). Draft tokens are written straight after the
    committed ones, so an accepted draft is already in place and the verify input is a view of `ids`."""

    ids: np.ndarray                 # int64 [max_len + k_max + 1]: committed tokens [0, length), then the drafts
    length: int                     # committed tokens: the prompt, then every token emitted (and a bonus past an eos)
    prompt_length: int
    max_new_tokens: int
    eos_ids: frozenset[int]
    params: SamplingParams
    uniforms: Uniforms              # draft [k_max], verify [1, k_max + 1]; drawn only when params sample
    sampling_inputs: dict[str, np.ndarray]  # temperature, top_k, top_p [1] each: params.graph_inputs()
    stats: DecodeStats
    k_max: int                      # the pack's: the most drafts one step may verify
    slot: int = 0                   # which of the backend's cache sets (and buffers) this request uses
    tree: TreeShape | None = None   # the next step's tree shape, set by a tree policy (tree_policy.py); None: the
                                    # drafter's own (a chain)
    out: list[int] = field(default_factory=list)  # tokens emitted, ending with the eos id when one ended generation

    @classmethod
    def start(cls, prompt: list[int], max_new_tokens: int, params: SamplingParams, uniforms: Uniforms, *,
              eos_ids: frozenset[int], max_len: int, k_max: int, stats: DecodeStats, slot: int = 0) -> DecodeState:
        """A new request over `prompt` (checked by the caller: 1 <= len(prompt), len + max_new_tokens <= max_len).

        `stats` is sized by the most drafts the request's k policy asks for (DecodeStats(k=policy.k_max)).
        """
        ids = np.zeros(max_len + k_max + 1, np.int64)
        ids[: len(prompt)] = prompt
        return cls(ids=ids, length=len(prompt), prompt_length=len(prompt), max_new_tokens=max_new_tokens,
                   eos_ids=eos_ids, params=params, uniforms=uniforms, sampling_inputs=params.graph_inputs(),
                   stats=stats, k_max=k_max, slot=slot)

    @property
    def remaining(self) -> int:
        """Tokens still allowed."""
        return self.max_new_tokens - len(self.out)

    @property
    def finished(self) -> bool:
        return len(self.out) >= self.max_new_tokens or (bool(self.out) and self.out[-1] in self.eos_ids)

    def commit(self, n_accepted: int, next_token: int) -> list[int]:
        """The first n_accepted drafts (already in place) and the next token become committed; returns the
        tokens to emit: those, cut after the first eos (nothing after an eos is ever emitted) and at the budget."""
        start = self.length
        self.ids[start + n_accepted] = next_token
        self.length = start + n_accepted + 1
        new = self.ids[start : self.length].tolist()
        for i, token in enumerate(new):
            if token in self.eos_ids or len(self.out) + i + 1 >= self.max_new_tokens:
                new = new[: i + 1]
                break
        self.out.extend(new)
        return new


class TreeShape(NamedTuple):
    """What a tree policy asks a tree drafter for, besides the node budget (the k it returns): docs/trees.md."""

    width: int                      # the most children a node gets (the n-gram trie: earlier occurrences merged)
    depth: int                      # the deepest node (tokens after the root)


class Proposal(NamedTuple):
    """k draft tokens for one verify; `tokens` is a view of state.ids[length : length + k] (no copy).

    A token tree (docs/trees.md) comes with `parents` [k]: node i's parent node (topological, parent < i), -1 for the
    root (the last committed token); None is a chain (node i's parent is i - 1).

    q is backend-resident (the backend that drew the drafts owns it; e.g. a numpy view [1, k, V] on the
    CPU, a device buffer on a GPU) and only that backend's target reads it. q None means a deterministic
    proposal: each draft's distribution is one-hot on its token (an n-gram drafter's), which the exact
    acceptance rule turns into "accept x with probability p(x)".
    """

    tokens: np.ndarray              # int64 [k]
    q: Any | None                   # [1, k, V] fp32 on the backend, or None: one-hot on `tokens`
    parents: np.ndarray | None = None  # int64 [k]: a tree's parent indices (None: a chain)

    @property
    def k(self) -> int:
        return len(self.tokens)


NO_DRAFTS = Proposal(tokens=np.zeros(0, np.int64), q=None)  # k = 0: the prefill and plain autoregressive steps


class VerifyResult(NamedTuple):
    n_accepted: int                 # leading drafts that passed the acceptance test (0..k)
    next_token: int                 # the correction at the first rejection, or the bonus token when all k passed
    path: np.ndarray | None = None  # int64 [n_accepted]: a tree's accepted nodes, increasing (None: a chain, 0..n-1)


class TreeStep(NamedTuple):
    """A verified tree, as the k policy observes it: the proposal's parents and the nodes the verify accepted."""

    parents: np.ndarray             # int64 [k]: node i's parent (-1: the root), topological
    path: np.ndarray                # int64 [n]: the accepted nodes, increasing (each one's parent is the one before)
