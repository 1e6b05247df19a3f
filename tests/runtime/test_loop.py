"""The decode loop's logic on the numpy reference engines (no graphs): greedy equality, caps, eos, stats."""

from __future__ import annotations

import numpy as np
import pytest

from specpack.runtime.buffers import DecodeBuffers
from specpack.runtime.loop import generate_tokens
from specpack.runtime.reference_engine import ReferenceDraftEngine, ReferenceTargetEngine, bigram_logits
from specpack.sampling import SamplingParams

V = 24


def _table(seed: int, sharp: float = 3.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, sharp, (V, V)).astype(np.float32)  # [V, V]


def _greedy_reference(table: np.ndarray, prompt: list[int], n: int, eos: frozenset[int]) -> list[int]:
    out, last = [], prompt[-1]
    for _ in range(n):
        last = int(np.argmax(table[last]))
        out.append(last)
        if last in eos:
            break
    return out


def _engines(target_table: np.ndarray, draft_table: np.ndarray, k_max: int = 8, max_len: int = 256):
    buffers = DecodeBuffers.allocate(max_len, k_max, V)
    draft = ReferenceDraftEngine(bigram_logits(draft_table), buffers)
    target = ReferenceTargetEngine(bigram_logits(target_table), buffers)
    return draft, target, buffers


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("draft_seed", [0, 1, 2])  # 0: the draft is the target
def test_greedy_equals_target_alone(k: int, draft_seed: int) -> None:
    target_table = _table(0)
    draft_table = target_table if draft_seed == 0 else target_table + _table(draft_seed, 2.0)
    draft, target, buffers = _engines(target_table, draft_table)
    buffers.set_sampling(SamplingParams())
    for prompt_len in (1, 5, 37):
        prompt = list(np.random.default_rng(prompt_len).integers(0, V, prompt_len))
        for max_new in (1, 2, 17, 60):
            tokens, stats = generate_tokens(draft, target, buffers, prompt, max_new, k, frozenset(), None)
            assert tokens == _greedy_reference(target_table, prompt, max_new, frozenset())
            assert stats.new_tokens == len(tokens) == max_new
            assert stats.proposed == sum(stats.proposed_at) and stats.accepted == sum(stats.accepted_at)
            assert stats.accepted <= stats.proposed <= k * stats.steps
            # k is capped at the tokens still allowed, so nothing proposed is thrown away unverified
            assert 1 + stats.steps + stats.accepted == max_new
            if draft_seed == 0:
                assert stats.alpha == (1.0 if stats.proposed else 0.0)


def test_stops_at_eos_and_includes_it() -> None:
    table = _table(3)
    prompt = [5]
    free = _greedy_reference(table, prompt, 40, frozenset())
    eos = frozenset({free[10]})
    draft, target, buffers = _engines(table, table + _table(9, 1.0))
    buffers.set_sampling(SamplingParams())
    tokens, _ = generate_tokens(draft, target, buffers, prompt, 40, 4, eos, None)
    assert tokens == _greedy_reference(table, prompt, 40, eos)
    assert tokens[-1] in eos and all(t not in eos for t in tokens[:-1])


def test_draft_catches_up_after_full_acceptance() -> None:
    """All k accepted: the draft has not seen the last draft token and the bonus; it feeds both (S = 2)."""
    table = _table(4)
    draft, target, buffers = _engines(table, table)
    buffers.set_sampling(SamplingParams())
    generate_tokens(draft, target, buffers, [1, 2, 3], 30, 3, frozenset(), None)
    # 1 target prefill + one verify per 4 tokens; the draft runs k times per step
    assert target.calls == 1 + 29 // 4 + (29 % 4 > 0)


def test_autoregressive_without_draft() -> None:
    table = _table(5)
    draft, target, buffers = _engines(table, table)
    buffers.set_sampling(SamplingParams())
    tokens, stats = generate_tokens(draft, target, buffers, [7], 20, 0, frozenset(), None)
    assert tokens == _greedy_reference(table, [7], 20, frozenset())
    assert stats.proposed == 0 and stats.steps == 19 and draft.calls == 0


def test_seeded_sampling_is_reproducible() -> None:
    table = _table(6, 1.0)
    draft, target, buffers = _engines(table, table + _table(7, 1.0))
    buffers.set_sampling(SamplingParams(temperature=0.8, top_p=0.9))
    runs = [generate_tokens(draft, target, buffers, [1], 30, 3, frozenset(),
                            np.random.Generator(np.random.Philox(seed)))[0] for seed in (11, 11, 12)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_drafting_stops_at_a_drafted_eos() -> None:
    """Drafts after an eos would never be emitted: the step verifies up to the eos and no further."""
    table = _table(8)
    prompt = [2]
    free = _greedy_reference(table, prompt, 40, frozenset())
    eos = frozenset({free[6]})
    draft, target, buffers = _engines(table, table)
    buffers.set_sampling(SamplingParams())
    tokens, stats = generate_tokens(draft, target, buffers, prompt, 40, 8, eos, None)
    assert tokens == _greedy_reference(table, prompt, 40, eos)
    assert tokens[-1] in eos
    # one step: the drafts up to and including the eos, all accepted; none proposed past it (k = 8)
    assert stats.steps == 1 and stats.proposed == stats.accepted == len(tokens) - 1 < 8
