"""Speculative sampling on the reference backend has the target's exact distribution (chi-square), for the model
drafter, for a deterministic one (q None: one-hot) and for the n-gram drafter (fixed and adaptive k), and the
same tests, at the same sample size and seed, reject each defect of tests/mutations.py.

Power. The outcome is the first LENGTH = 3 tokens over a vocabulary of 10 (1,000 continuations, rare ones pooled);
SAMPLES = 2,500 generations per test, alpha P_FAIL = 1e-3. Measured at this size (2026-11-27): every correct
setting p >= 0.06; the mutations, in settings where they change the distribution, p <= 3e-13 (q before the transform at
T 0.5 k 1: 3e-13; the others below 1e-40). At this size a test detects an effect of Cohen's w >= 0.17-0.21 with
99 % power (`detectable_effect`, tests/distribution.py); the mutations' effects, measured from 40,000 draws each
(`effect_size`): q before the transform 0.23, temperature twice 0.45, residual of the next row 0.93 (1.5 with
deterministic or n-gram drafts), top-p dropping ties 1.56. The slow set repeats the main grid at 10,000.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from harness import LookupDrafter, bigram_backend, run

from specpack.graphs import oracle
from specpack.runtime.adaptive_k import AdaptiveK, PriorCosts
from specpack.runtime.drafter import Drafter
from specpack.runtime.k_policy import KPolicy
from specpack.runtime.ngram_drafter import NgramConfig, NgramDrafter
from specpack.runtime.state import DecodeState
from specpack.sampling import SamplingParams
from tests.distribution import chi_square_pvalue, exact_continuations, transformed_next_probs
from tests.mutations import ORACLE_MUTATIONS, oracle_mutation

V, PROMPT, LENGTH, SAMPLES, P_FAIL = 10, [3], 3, 2500, 1e-3
SIZES = [SAMPLES, pytest.param(10_000, marks=pytest.mark.slow)]  # the slow set: the grid at twice the resolution
SETTINGS = [SamplingParams(0.5), SamplingParams(1.0), SamplingParams(1.5), SamplingParams(1.0, top_k=5),
            SamplingParams(1.0, top_p=0.8)]
TIED_TOP_P = SamplingParams(1.0, top_p=0.6)  # on the tied table: the cutoff falls inside a group of equal logits


def _tables(tied: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(target [V, V], draft [V, V]) logits; tied: the target's rounded to integers (ties in every row)."""
    rng = np.random.default_rng(0)
    target = rng.normal(0, 1.5, (V, V)).astype(np.float32)
    draft = target + rng.normal(0, 1.0, (V, V)).astype(np.float32)  # agrees often, not always
    return (np.round(target) if tied else target), draft


def _samples(params: SamplingParams, k: int, drafter: Drafter | None = None, tied: bool = False,
             n: int = SAMPLES) -> list[tuple[int, ...]]:
    target_table, draft_table = _tables(tied)
    backend = bigram_backend(target_table, draft_table, k_max=8)
    rng = np.random.Generator(np.random.Philox(1234))  # one generator across every generation
    # k + 2 new tokens, so the first step really verifies k drafts (k is capped at the tokens still allowed);
    # the first LENGTH tokens of the output then have the exact LENGTH-token continuation distribution
    return [tuple(run(backend, PROMPT, max(LENGTH, k + 2), k, params=params, generator=rng, max_len=16,
                      drafter=drafter)[0].out[:LENGTH]) for _ in range(n)]


def _exact(params: SamplingParams, tied: bool = False, prompt: list[int] = PROMPT) -> dict[tuple[int, ...], float]:
    target_table, _ = _tables(tied)
    return exact_continuations(transformed_next_probs(lambda ids: target_table[ids[-1]], params), prompt, LENGTH,
                               frozenset())


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_distribution_is_the_targets(params: SamplingParams, k: int, n: int) -> None:
    p = chi_square_pvalue(_samples(params, k, n=n), _exact(params))
    print(f"p = {p:.3g}")
    assert p > P_FAIL


def test_ties_at_the_top_p_cutoff_keep_the_distribution() -> None:
    """Top-p keeps a whole tie group at its cutoff (the oracle's rule); the tied table puts one there."""
    target, _ = _tables(tied=True)
    p = oracle.transform(target[PROMPT[-1]][None], TIED_TOP_P)[0]
    kept = target[PROMPT[-1]][p > 0]
    assert (kept == kept.min()).sum() > 1, "no tie at the cutoff: the case tests nothing"
    p = chi_square_pvalue(_samples(TIED_TOP_P, 3, tied=True), _exact(TIED_TOP_P, tied=True))
    print(f"p = {p:.3g}")
    assert p > P_FAIL


def _draft_greedy_continuation(state: DecodeState) -> list[int]:
    """The draft table's greedy continuation of the last token (right often, not always)."""
    _, draft_table = _tables()
    last, out = int(state.ids[state.length - 1]), []
    for _ in range(3):
        last = int(np.argmax(draft_table[last]))
        out.append(last)
    return out


@pytest.mark.parametrize("params", [SETTINGS[1], SETTINGS[3]], ids=str)
def test_deterministic_drafts_keep_the_distribution(params: SamplingParams) -> None:
    """q None (one-hot): accept x with probability p(x), else draw from p without x."""
    samples = _samples(params, 3, drafter=LookupDrafter(_draft_greedy_continuation))
    p = chi_square_pvalue(samples, _exact(params))
    print(f"p = {p:.3g}")
    assert p > P_FAIL


NGRAM_CASES = [(SETTINGS[0], 3), (SETTINGS[1], None), (SETTINGS[4], 3)]  # k None: adaptive
NGRAM_PROMPT = [int(t) for t in np.random.default_rng(5).integers(0, V, 24)]


def _ngram_samples(params: SamplingParams, k: int | None) -> tuple[list[tuple[int, ...]], int, int]:
    """(continuations, proposed, accepted) of SAMPLES generations with prompt lookup on NGRAM_PROMPT."""
    target_table, draft_table = _tables()
    backend = bigram_backend(target_table, draft_table, k_max=8)
    rng = np.random.Generator(np.random.Philox(99))

    def policy() -> KPolicy | int:
        return 3 if k is not None else AdaptiveK(8, costs=PriorCosts(0.0))

    samples, proposed, accepted = [], 0, 0
    for _ in range(SAMPLES):
        state, _ = run(backend, NGRAM_PROMPT, LENGTH + 2, policy(), params=params, generator=rng, max_len=64,
                       drafter=NgramDrafter(NgramConfig(n_min=1, n_max=3)))
        samples.append(tuple(state.out[:LENGTH]))
        proposed, accepted = proposed + state.stats.proposed, accepted + state.stats.accepted
    return samples, proposed, accepted


@pytest.mark.parametrize(("params", "k"), NGRAM_CASES, ids=[f"{p}-k{k}" for p, k in NGRAM_CASES])
def test_ngram_drafter_keeps_the_distribution(params: SamplingParams, k: int | None) -> None:
    """Prompt lookup (q None) on a 24-token prompt sampled from the bigram target itself, so that what followed a
    token before is often what the target draws after it again: drafts both accepted and rejected. k None:
    adaptive k, with the costs fixed (PriorCosts) as Pack.generate does for seeded sampling."""
    samples, proposed, accepted = _ngram_samples(params, k)
    assert accepted > 250 and proposed - accepted > 250, (proposed, accepted)  # both paths, hundreds of times
    p = chi_square_pvalue(samples, _exact(params, prompt=NGRAM_PROMPT))
    print(f"p = {p:.3g}")
    assert p > P_FAIL


# case -> (mutation, its samples, the exact distribution): each defect, in a setting where it changes the
# distribution, drawn by the very function of a test above, at that test's sample size and seed
Sampler = Callable[[], list[tuple[int, ...]]]
Exact = Callable[[], dict[tuple[int, ...], float]]
MUTATION_CASES: dict[str, tuple[str, Sampler, Exact]] = {
    "q_before_transform": ("q_before_transform", lambda: _samples(SETTINGS[0], 1), lambda: _exact(SETTINGS[0])),
    "residual_next_row": ("residual_next_row", lambda: _samples(SETTINGS[1], 3), lambda: _exact(SETTINGS[1])),
    "top_p_drops_ties": ("top_p_drops_ties", lambda: _samples(TIED_TOP_P, 3, tied=True),
                         lambda: _exact(TIED_TOP_P, tied=True)),
    "temperature_twice": ("temperature_twice", lambda: _samples(SETTINGS[2], 3), lambda: _exact(SETTINGS[2])),
    "deterministic-residual_next_row": (
        "residual_next_row", lambda: _samples(SETTINGS[1], 3, drafter=LookupDrafter(_draft_greedy_continuation)),
        lambda: _exact(SETTINGS[1])),
    "ngram-residual_next_row": ("residual_next_row", lambda: _ngram_samples(SETTINGS[1], None)[0],
                                lambda: _exact(SETTINGS[1], prompt=NGRAM_PROMPT)),
    "ngram-temperature_twice": ("temperature_twice", lambda: _ngram_samples(SETTINGS[0], 3)[0],
                                lambda: _exact(SETTINGS[0], prompt=NGRAM_PROMPT)),
}


def test_every_oracle_mutation_has_a_case() -> None:
    assert {mutation for mutation, _, _ in MUTATION_CASES.values()} == set(ORACLE_MUTATIONS)


@pytest.mark.parametrize("case", MUTATION_CASES)
def test_mutation_is_caught(case: str) -> None:
    """The exact distribution is the correct oracle's; the samples carry the defect: rejected at P_FAIL."""
    mutation, sampler, exact = MUTATION_CASES[case]
    expected = exact()
    with oracle_mutation(mutation):
        samples = sampler()
    p = chi_square_pvalue(samples, expected)
    print(f"p = {p:.3g}")
    assert p < P_FAIL
