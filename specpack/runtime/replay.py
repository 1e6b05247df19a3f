"""Greedy speculative decoding replayed through the loop itself (loop.decode) from a known continuation: no model runs.

Greedy speculative decoding emits exactly the target's own greedy tokens T. So once T is known, a `ReplayTarget`
verifies any proposal from it (the greedy acceptance test, graphs/oracle.py's greedy_verify, where argmax p at a
drafted position is T's token as long as every draft before it was accepted: the target then read exactly T), and
the loop's own steps (k capped at the tokens still allowed, the commit, the drafter's commit, the statistics) give
what the runtime would measure with that drafter and k policy. A model drafter is replayed by `ArgmaxDrafter` from
one teacher-forced pass of the draft over T (while its drafts are accepted it reads exactly T too). A token tree
(Proposal.parents) is replayed by the greedy tree rule (docs/trees.md): from the root, the first child whose token is
T's next token, as long as there is one; its path moves into place as Target's does.

quantize/fidelity.py (greedy alpha and tau of a quantized draft) and bench/'s replays (adaptive_replay.py,
ngram_replay.py) go through `replay_greedy`, so they cannot drift from the loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specpack.graphs.oracle import greedy_verify
from specpack.runtime.drafter import Drafter
from specpack.runtime.k_policy import KPolicy
from specpack.runtime.loop import decode
from specpack.runtime.state import DecodeState, Proposal, VerifyResult
from specpack.runtime.stats import DecodeStats
from specpack.sampling import SamplingParams, Uniforms


class ReplayTarget:
    """A TargetModel (backend.py) whose greedy argmaxes are a known sequence: prompt + the target's continuation."""

    def __init__(self, sequence: Sequence[int]) -> None:
        self.sequence = np.asarray(sequence, np.int64)  # [prompt + new tokens]

    def reset(self, state: DecodeState) -> None:
        pass

    def verify(self, state: DecodeState, proposal: Proposal) -> VerifyResult:
        start = state.length
        if proposal.parents is not None and proposal.k:
            return self._tree(state, proposal.tokens.tolist(), proposal.parents.tolist())
        best = self.sequence[start : start + proposal.k + 1]  # [k+1] argmax p at each row, while the drafts hold
        return VerifyResult(*greedy_verify(best, proposal.tokens))

    def _tree(self, state: DecodeState, tokens: list[int], parents: list[int]) -> VerifyResult:
        """The greedy tree rule along the known sequence: the accepted path (node indices) and the next token."""
        start, node = state.length, -1
        path: list[int] = []
        while True:
            want = int(self.sequence[start + len(path)])  # argmax p after the root path so far
            child = next((i for i in range(node + 1, len(tokens)) if parents[i] == node and tokens[i] == want), None)
            if child is None:
                break
            path.append(child)
            node = child
        accepted = np.asarray(path, np.int64)  # [n]
        state.ids[start : start + len(path)] = [tokens[i] for i in path]
        return VerifyResult(len(path), int(self.sequence[start + len(path)]), accepted)

    def rollback(self, state: DecodeState, length: int) -> None:
        pass


class ArgmaxDrafter:
    """A Drafter proposing a model draft's greedy tokens from its teacher-forced argmaxes over the sequence:
    next_tokens[i] is the draft's argmax after sequence[: i + 1] (-1 where unknown: never accepted)."""

    def __init__(self, next_tokens: Sequence[int]) -> None:
        self.next_tokens = np.asarray(next_tokens, np.int64)  # [len(sequence)]

    def begin(self, state: DecodeState) -> None:
        pass

    def propose(self, state: DecodeState, k: int) -> Proposal:
        start = state.length
        state.ids[start : start + k] = self.next_tokens[start - 1 : start - 1 + k]
        return Proposal(tokens=state.ids[start : start + k], q=None)

    def commit(self, state: DecodeState) -> None:
        pass


def replay_greedy(sequence: Sequence[int], prompt_length: int, drafter: Drafter, policy: KPolicy,
                  eos_ids: frozenset[int] = frozenset()) -> DecodeState:
    """loop.decode over a ReplayTarget of `sequence` (prompt + the target's greedy continuation; all of it is
    emitted unless an eos in `eos_ids` ends it first); the finished state, its statistics in state.stats."""
    params = SamplingParams()
    k_max = policy.k_max
    state = DecodeState.start(list(sequence[:prompt_length]), len(sequence) - prompt_length, params,
                              Uniforms(params, k_max), eos_ids=eos_ids, max_len=len(sequence), k_max=k_max,
                              stats=DecodeStats(k=k_max))
    decode(state, ReplayTarget(sequence), drafter, policy)
    return state
