"""Exact distributions of short continuations, and a chi-square test of samples against them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

from specpack.graphs import oracle
from specpack.sampling import SamplingParams

Continuation = tuple[int, ...]
NextProbs = Callable[[list[int]], np.ndarray]  # prefix ids -> transformed next-token probabilities [V]


def exact_continuations(next_probs: NextProbs, prompt: Sequence[int], length: int,
                        eos_ids: frozenset[int]) -> dict[Continuation, float]:
    """P(x_1..x_m | prompt) for every continuation of `length` tokens (shorter when it ends with an eos)."""
    dist: dict[Continuation, float] = {(): 1.0}
    for _ in range(length):
        grown: dict[Continuation, float] = {}
        for seq, mass in dist.items():
            if seq and seq[-1] in eos_ids:
                grown[seq] = mass
                continue
            probs = next_probs([*prompt, *seq]).astype(np.float64)
            probs /= probs.sum()
            for token in np.flatnonzero(probs > 0):
                grown[(*seq, int(token))] = mass * probs[token]
        dist = grown
    return dist


def transformed_next_probs(logits_of: Callable[[list[int]], np.ndarray], params: SamplingParams) -> NextProbs:
    """Next-token probabilities after the sampling transform (the oracle's), from raw next-token logits [V]."""
    return lambda prefix: oracle.transform(logits_of(prefix)[None, :].astype(np.float32), params)[0]


def chi_square_pvalue(samples: Sequence[Continuation], exact: dict[Continuation, float], min_expected: float = 5.0) -> float:
    """Pearson chi-square of sample counts against exact probabilities; rare outcomes pooled into one bin."""
    n = len(samples)
    counts = Counter(samples)
    unknown = sum(c for seq, c in counts.items() if seq not in exact)
    if unknown:  # a continuation of probability 0 was sampled: the sampler is wrong
        return 0.0
    observed, expected, pool_obs, pool_exp = [], [], 0.0, 0.0
    for seq, p in exact.items():
        if n * p >= min_expected:
            observed.append(counts.get(seq, 0))
            expected.append(n * p)
        else:
            pool_obs += counts.get(seq, 0)
            pool_exp += n * p
    if pool_exp > 0:
        observed.append(pool_obs)
        expected.append(pool_exp)
    if len(observed) < 2:
        return 1.0
    obs, exp = np.asarray(observed, float), np.asarray(expected, float)
    exp *= obs.sum() / exp.sum()
    return float(stats.chisquare(obs, exp).pvalue)
