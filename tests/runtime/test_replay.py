"""runtime/replay.py: greedy decoding replayed through loop.decode from a known continuation."""

from __future__ import annotations

from specpack.runtime.adaptive_k import AdaptiveK, PriorCosts
from specpack.runtime.k_policy import FixedK
from specpack.runtime.ngram_drafter import NgramConfig, NgramDrafter
from specpack.runtime.replay import ArgmaxDrafter, replay_greedy
from specpack.runtime.tree_policy import FixedTree, TreePolicy


def test_argmax_drafter_by_hand() -> None:
    # prompt [9, 9], then 1..6; the draft is right except where it should predict 4 or 5
    sequence, draft_next = [9, 9, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 0, 0, 6, 0]
    state = replay_greedy(sequence, 2, ArgmaxDrafter(draft_next), FixedK(2))
    # prefill: 1; step 1: 2, 3 accepted + 4; step 2: one draft (2 tokens left), rejected, 5; step 3: k = 0, 6
    assert state.out == [1, 2, 3, 4, 5, 6]
    assert (state.stats.steps, state.stats.proposed, state.stats.accepted) == (3, 3, 2)
    assert state.stats.k_histogram == [1, 1, 1]


def test_any_drafter_and_policy_emit_the_sequence() -> None:
    """Whatever the drafter proposes, the replayed output is the continuation, cut at an eos."""
    sequence = [5, 6, 7, 5, 6, 7, 5, 6, 8, 5, 6, 7, 1, 5]
    for policy in (FixedK(0), FixedK(3), AdaptiveK(4)):
        assert replay_greedy(sequence, 3, NgramDrafter(), policy).out == sequence[3:]
    state = replay_greedy(sequence, 3, NgramDrafter(), FixedK(4), eos_ids=frozenset({1}))
    assert state.out == sequence[3:13] and state.stats.accepted > 0  # the lookups find the repeats


def test_trees_are_replayed_by_the_greedy_tree_rule() -> None:
    """A trie of the repeats' continuations (5 6 7 and 5 6 8 both follow 5 6): the walk takes whichever child the
    sequence continues with, so the tries accept at least what the chains do, and the output is the continuation."""
    sequence = [5, 6, 7, 5, 6, 8, 5, 6, 7, 5, 6, 8, 5, 6, 7, 5, 6, 8, 5, 6, 7, 2]
    chains = replay_greedy(sequence, 3, NgramDrafter(NgramConfig(1, 2)), FixedK(4))
    for policy in (FixedTree(4, 2), TreePolicy(4, 2, costs=PriorCosts(0.0))):  # replays have no clock to follow
        trees = replay_greedy(sequence, 3, NgramDrafter(NgramConfig(1, 2, width=2)), policy)
        assert trees.out == chains.out == sequence[3:]
        assert trees.stats.accepted >= chains.stats.accepted
    assert replay_greedy(sequence, 3, NgramDrafter(NgramConfig(1, 2, width=2)), FixedTree(4, 2)).stats.accepted > \
        chains.stats.accepted
