"""The n-gram index and drafter: matches, the n fallback, the most recent match, incremental updates equal to
a brute-force rescan, and proposals through the loop (greedy output equal to the target alone's)."""

from __future__ import annotations

import numpy as np
import pytest
from harness import ScriptedK, bigram_backend, greedy_reference, run, table

from specpack.errors import SpecpackError
from specpack.runtime.ngram_drafter import NgramConfig, NgramDrafter
from specpack.runtime.ngram_index import NgramIndex
from specpack.runtime.state import DecodeState
from specpack.runtime.stats import DecodeStats
from specpack.sampling import SamplingParams, Uniforms


def brute_force_match(tokens: list[int], n_min: int, n_max: int) -> tuple[int, int]:
    """The oracle: rescan for the latest earlier occurrence of the suffix n-gram, n from n_max down."""
    length = len(tokens)
    for n in range(min(n_max, length), n_min - 1, -1):
        suffix = tokens[length - n :]
        for end in range(length - 1, n - 1, -1):  # ends before the current one, latest first
            if tokens[end - n : end] == suffix:
                return end, n
    return -1, 0


def index_of(tokens: list[int], n_min: int, n_max: int) -> NgramIndex:
    index = NgramIndex(n_min, n_max)
    index.extend(np.asarray(tokens, np.int64), len(tokens))
    return index


def test_latest_earlier_match_of_the_longest_n() -> None:
    #         0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 8, 5, 6, 9, 1, 5, 6]
    assert index_of(tokens, 1, 3).match() == (6, 2)  # [5, 6] ended at 2 and at 6: the latest, 6
    assert index_of(tokens[:7], 1, 3).match() == (-1, 0)  # the suffix [5, 6, 9] / [6, 9] / [9] never occurred
    assert index_of([*tokens, 9], 1, 3).match() == (7, 3)  # [5, 6, 9] ended at 7: n = 3 beats the latest [9] too


def test_falls_back_to_shorter_n() -> None:
    tokens = [1, 2, 3, 9, 3]
    assert index_of(tokens, 1, 4).match() == (3, 1)  # [9, 3], [3, 9, 3], ... never occurred; [3] ended at 3
    assert index_of(tokens, 2, 4).match() == (-1, 0)  # n = 1 not allowed
    assert index_of([7], 1, 2).match() == (-1, 0)  # nothing earlier than the only token
    assert index_of([7, 7], 1, 2).match() == (1, 1)  # the token itself, once before
    assert index_of([7, 7, 7], 1, 2).match() == (2, 2)  # [7, 7] ended at 2, not at 3 (itself)


@pytest.mark.parametrize("seed", range(6))
def test_incremental_updates_equal_a_rescan(seed: int) -> None:
    """After every push, the index answers what a brute-force rescan of the whole sequence answers."""
    rng = np.random.default_rng(seed)
    vocab = [2, 3, 5, 40][seed % 4]  # few symbols: many matches, all n
    n_min, n_max = [(1, 1), (1, 4), (2, 3), (3, 6), (1, 8), (2, 2)][seed]
    tokens = rng.integers(0, vocab, 300).tolist()
    if seed % 2:
        tokens += tokens[:60]  # a long repeat
    index = NgramIndex(n_min, n_max)
    for i, token in enumerate(tokens):
        index.push(token)
        assert index.match() == brute_force_match(tokens[: i + 1], n_min, n_max), i
    index.reset()
    assert index.length == 0 and index.match() == (-1, 0)
    index.extend(np.asarray(tokens, np.int64), 100)
    assert index.match() == brute_force_match(tokens[:100], n_min, n_max)


def test_large_token_ids_are_exact() -> None:
    """Keys pack tokens without hashing: ids that would collide under a small modulus stay apart."""
    a, b = 151_935, 151_935 + (1 << 20)
    assert index_of([a, 1, b, 1], 1, 2).match() == (2, 1)  # [b, 1] != [a, 1]: only n = 1 matches
    assert index_of([a, 1, a, 1], 1, 2).match() == (2, 2)


def test_config_is_checked() -> None:
    for bad in ({"n_min": 0}, {"n_max": 33}, {"n_min": 3, "n_max": 2}, {"n_min": True}):
        with pytest.raises(SpecpackError, match="n-gram"):
            NgramConfig(**bad)  # type: ignore[arg-type]


def state_of(tokens: list[int], eos: frozenset[int] = frozenset()) -> DecodeState:
    params = SamplingParams()
    return DecodeState.start(tokens, 16, params, Uniforms(params, 8), eos_ids=eos, max_len=64, k_max=8,
                             stats=DecodeStats(k=8))


def test_proposes_the_continuation_up_to_k_and_never_past_the_present() -> None:
    #         0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    drafter, state = NgramDrafter(NgramConfig(1, 3)), state_of(tokens)
    drafter.begin(state)
    proposal = drafter.propose(state, 4)
    assert proposal.tokens.tolist() == [4, 5, 6, 7] and proposal.q is None
    assert state.ids[10:14].tolist() == [4, 5, 6, 7]  # written in place, after the committed tokens
    assert drafter.propose(state, 16).tokens.tolist() == [4, 5, 6, 7, 1, 2, 3]  # up to the present, no further
    state.commit(2, 9)  # 4, 5 accepted, then 9: the context is now ... 1, 2, 3, 4, 5, 9
    drafter.commit(state)
    assert drafter.propose(state, 4).tokens.tolist() == []  # [5, 9], [4, 5, 9], [9] never occurred


def test_stops_at_a_drafted_eos() -> None:
    drafter, state = NgramDrafter(NgramConfig(2, 2)), state_of([1, 2, 9, 3, 4, 1, 2], eos=frozenset({9}))
    drafter.begin(state)
    assert drafter.propose(state, 5).tokens.tolist() == [9]  # 9, 3, 4, ... with 9 an eos


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("ks", [[4], [8], [2, 0, 5, 0, 0, 8, 1]])
def test_through_the_loop_output_is_the_targets(ks: list[int], sampled: bool) -> None:
    """A context that repeats, so proposals happen and are sometimes rejected; k = 0 steps in between (no
    commit call: the index catches up on the next proposal); greedy output equal to the target alone's."""
    t = table(20, 5, sharp=4.0)
    backend = bigram_backend(t, t)
    prompt = np.random.default_rng(1).integers(0, 20, 40).tolist()
    prompt = prompt + prompt[:25]
    params = SamplingParams(1.0) if sampled else SamplingParams()
    state, _ = run(backend, prompt, 60, ScriptedK(ks), drafter=NgramDrafter(NgramConfig(1, 3)), params=params,
                   seed=2, max_len=256)
    if not sampled:
        assert state.out == greedy_reference(t, prompt, 60, frozenset())
    stats = state.stats
    assert stats.proposed > 0 and 0 < stats.accepted < stats.proposed  # proposals happen, some are rejected
    assert not backend.draft_loaded  # no draft model
    assert sum(stats.k_histogram) == sum(stats.k_asked_histogram) == stats.steps


def test_slots_keep_their_own_index() -> None:
    t = table(20, 7)
    backend = bigram_backend(t, t, slots=2)
    drafter = NgramDrafter(NgramConfig(1, 2))
    a = [1, 2, 3, 1, 2, 3, 1, 2]
    b = [7, 8, 9, 7, 8]
    for slot, prompt in ((0, a), (1, b), (0, a)):
        state, _ = run(backend, prompt, 10, 3, drafter=drafter, slot=slot)
        assert state.out == greedy_reference(t, prompt, 10, frozenset())
