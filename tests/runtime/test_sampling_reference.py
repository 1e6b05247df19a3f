"""Speculative sampling on the reference backend has the target's exact distribution (chi-square), for the model
drafter, for a deterministic one (q None: one-hot) and for the n-gram drafter (fixed and adaptive k), and the
same test catches a draft whose q is not the distribution its token was drawn from."""

from __future__ import annotations

import numpy as np
import pytest
from harness import LookupDrafter, bigram_backend, run

from specpack.graphs import oracle
from specpack.runtime.adaptive_k import AdaptiveK, PriorCosts
from specpack.runtime.backends.reference import ReferenceDraft
from specpack.runtime.drafter import Drafter
from specpack.runtime.k_policy import KPolicy
from specpack.runtime.ngram_drafter import NgramConfig, NgramDrafter
from specpack.runtime.state import DecodeState
from specpack.sampling import SamplingParams
from tests.distribution import chi_square_pvalue, exact_continuations, transformed_next_probs

V, PROMPT, LENGTH, SAMPLES = 10, [3], 3, 10_000
SETTINGS = [SamplingParams(0.5), SamplingParams(1.0), SamplingParams(1.5), SamplingParams(1.0, top_k=5),
            SamplingParams(1.0, top_p=0.8)]


class _QBeforeTransform(ReferenceDraft):
    """Broken on purpose: draws from the transformed distribution but reports q before the transform."""

    def step(self, state: DecodeState, end: int, row: int) -> int:
        token = super().step(state, end, row)
        logits = self.logits_fn(state.ids[:end], 1).astype(np.float32)  # [1, V]
        self.q(state, row + 1)[0, row] = oracle.transform(logits, SamplingParams(1.0))[0]
        return token


def _tables() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    target = rng.normal(0, 1.5, (V, V)).astype(np.float32)
    draft = target + rng.normal(0, 1.0, (V, V)).astype(np.float32)  # agrees often, not always
    return target, draft


def _samples(params: SamplingParams, k: int, broken: bool = False, drafter: Drafter | None = None) -> list[tuple[int, ...]]:
    target_table, draft_table = _tables()
    backend = bigram_backend(target_table, draft_table, k_max=8)
    if broken:
        backend._draft = _QBeforeTransform(backend.draft().logits_fn, 1, 8, V)
    rng = np.random.Generator(np.random.Philox(1234))  # one generator across every generation
    # k + 2 new tokens, so the first step really verifies k drafts (k is capped at the tokens still allowed);
    # the first LENGTH tokens of the output then have the exact LENGTH-token continuation distribution
    return [tuple(run(backend, PROMPT, max(LENGTH, k + 2), k, params=params, generator=rng, max_len=16,
                      drafter=drafter)[0].out[:LENGTH]) for _ in range(SAMPLES)]


def _exact(params: SamplingParams) -> dict[tuple[int, ...], float]:
    target_table, _ = _tables()
    return exact_continuations(transformed_next_probs(lambda ids: target_table[ids[-1]], params), PROMPT, LENGTH,
                               frozenset())


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_distribution_is_the_targets(params: SamplingParams, k: int) -> None:
    assert chi_square_pvalue(_samples(params, k), _exact(params)) > 1e-3


@pytest.mark.parametrize("params", [SETTINGS[1], SETTINGS[3]], ids=str)
def test_deterministic_drafts_keep_the_distribution(params: SamplingParams) -> None:
    """q None (one-hot): accept x with probability p(x), else draw from p without x; the draft's greedy
    continuation as the proposal (right often, not always)."""
    _, draft_table = _tables()

    def continuation(state: DecodeState) -> list[int]:
        last, out = int(state.ids[state.length - 1]), []
        for _ in range(3):
            last = int(np.argmax(draft_table[last]))
            out.append(last)
        return out

    assert chi_square_pvalue(_samples(params, 3, drafter=LookupDrafter(continuation)), _exact(params)) > 1e-3


@pytest.mark.parametrize("params", [SamplingParams(0.5), SamplingParams(1.0, top_k=2), SamplingParams(1.0, top_p=0.6)], ids=str)
def test_catches_q_taken_before_the_transform(params: SamplingParams) -> None:
    assert chi_square_pvalue(_samples(params, 3, broken=True), _exact(params)) < 1e-3


NGRAM_CASES = [(SETTINGS[0], 3), (SETTINGS[1], None), (SETTINGS[4], 3)]  # k None: adaptive


@pytest.mark.parametrize(("params", "k"), NGRAM_CASES, ids=[f"{p}-k{k}" for p, k in NGRAM_CASES])
def test_ngram_drafter_keeps_the_distribution(params: SamplingParams, k: int | None) -> None:
    """Prompt lookup (q None) on a 24-token prompt sampled from the bigram target itself, so that what followed a
    token before is often what the target draws after it again: drafts both accepted and rejected. k None:
    adaptive k, with the costs fixed (PriorCosts) as Pack.generate does for seeded sampling."""
    target_table, draft_table = _tables()
    backend = bigram_backend(target_table, draft_table, k_max=8)
    prompt = [int(t) for t in np.random.default_rng(5).integers(0, V, 24)]
    rng = np.random.Generator(np.random.Philox(99))

    def policy() -> KPolicy | int:
        return 3 if k is not None else AdaptiveK(8, costs=PriorCosts(0.0))

    samples, proposed, accepted = [], 0, 0
    for _ in range(SAMPLES):
        state, _ = run(backend, prompt, LENGTH + 2, policy(), params=params, generator=rng, max_len=64,
                       drafter=NgramDrafter(NgramConfig(n_min=1, n_max=3)))
        samples.append(tuple(state.out[:LENGTH]))
        proposed, accepted = proposed + state.stats.proposed, accepted + state.stats.accepted
    assert accepted > 1000 and proposed - accepted > 1000, (proposed, accepted)  # both paths, thousands of times
    exact = exact_continuations(transformed_next_probs(lambda ids: target_table[ids[-1]], params), prompt, LENGTH,
                                frozenset())
    assert chi_square_pvalue(samples, exact) > 1e-3
