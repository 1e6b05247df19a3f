"""Exact distributions of short continuations, and a chi-square test of samples against them.

`exact_continuations` enumerates every continuation (small vocabularies, short lengths). `ExactPartition`
is for flat distributions over a real vocabulary, where almost every continuation is too rare to have a
bin of its own: it expands only prefixes frequent enough to matter, and groups the rare next tokens of
each expanded prefix into rank-quantile bins shared across prefixes, so every sample still lands in a bin
of exactly known probability and the speculative positions keep their statistical power.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from scipy import stats

from specpack.graphs import oracle
from specpack.sampling import SamplingParams

Continuation = tuple[int, ...]
NextProbs = Callable[[list[int]], np.ndarray]  # prefix ids -> transformed next-token probabilities [V]
BatchProbs = Callable[[list[Continuation]], np.ndarray]  # continuations so far [N] -> next-token probabilities [N, V]
Bin = TypeVar("Bin", bound=Hashable)


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


def chi_square_pvalue(samples: Sequence[Bin], exact: Mapping[Bin, float], min_expected: float = 5.0) -> float:
    """Pearson chi-square of sample counts against exact probabilities; rare outcomes pooled into one bin.

    An outcome of probability 0 (absent from `exact`) gives p = 0: the sampler is wrong.
    """
    n = len(samples)
    if any(seq not in exact for seq in set(samples)):  # a continuation of probability 0 was sampled: the sampler is wrong
        return 0.0
    bins = pooled(exact, n, min_expected)
    if len(bins) < 2:
        return 1.0
    counts = Counter(s if s in bins else None for s in samples)
    obs = np.asarray([counts.get(b, 0) for b in bins], float)
    exp = n * np.asarray(list(bins.values()), float)
    exp *= obs.sum() / exp.sum()
    return float(stats.chisquare(obs, exp).pvalue)


def pooled(exact: Mapping[Bin, float], n: int, min_expected: float = 5.0) -> dict[Bin, float]:
    """exact's outcomes with n * p >= min_expected, and the rest pooled under the key None: chi_square_pvalue's bins."""
    out: dict[Bin | None, float] = {b: p for b, p in exact.items() if n * p >= min_expected}
    if rare := sum(p for b, p in exact.items() if n * p < min_expected):
        out[None] = rare
    return out  # type: ignore[return-value]


def detectable_effect(n: int, bins: int, p_fail: float = 1e-3, power: float = 0.99) -> float:
    """The smallest effect (Cohen's w = sqrt(sum (p1 - p0)^2 / p0) over the bins) that a chi-square of n samples in
    `bins` bins rejects at level p_fail with probability `power` (noncentral chi-square, lambda = n w^2)."""
    df = bins - 1
    critical = stats.chi2.ppf(1.0 - p_fail, df)
    lo, hi = 0.0, 1e4  # lambda
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if stats.ncx2.sf(critical, df, mid) >= power else (mid, hi)
    return float(np.sqrt(hi / n))


def effect_size(samples: Sequence[Bin], exact: Mapping[Bin, float], n: int) -> float:
    """Cohen's w of the samples' distribution against the exact one, over the bins a test of n samples uses
    (estimate it from many more than n samples: its noise is about sqrt(bins / len(samples)))."""
    bins = pooled(exact, n)
    counts = Counter(s if s in bins else None for s in samples)
    total = len(samples)
    return float(np.sqrt(sum((counts.get(b, 0) / total - p) ** 2 / p for b, p in bins.items())))


@dataclass(frozen=True)
class RankBin:
    """The bin of the rare next tokens at `depth` (1-based) whose rank-quantile group is `group`."""

    depth: int
    group: int


@dataclass
class ExactPartition:
    """A partition of the continuations of `length` tokens into bins of exactly known probability.

    Built for n samples, from the root: the next-token distribution of an expanded prefix s is computed,
    and each next token t is either frequent (n * P(s + t) >= min_expected: s + t is a prefix of its own)
    or rare: then it falls into the rank-quantile bin RankBin(depth, g), where s's rare tokens in
    descending probability are cut into `groups` slices of equal mass (g: the slice of t's midpoint).
    Rank bins pool every expanded prefix at one depth, so a distortion of the next-token distributions
    shows up even where each continuation is rare. Frequent prefixes are expanded in turn, except those
    that end with an eos or are `length` long: those are bins of their own, keyed by the continuation.
    """

    probs: dict[Hashable, float]  # bin -> exact probability (sums to 1)
    groups_of: dict[Continuation, np.ndarray] = field(default_factory=dict)  # expanded prefix -> [V] group, -1: none

    @classmethod
    def build(cls, next_probs: BatchProbs, length: int, eos_ids: frozenset[int], n: int, min_expected: float = 5.0,
              groups: int = 10) -> ExactPartition:
        """Expand the prefix tree level by level (one next_probs call per level)."""
        part = cls(defaultdict(float))
        frontier: dict[Continuation, float] = {(): 1.0}
        for depth in range(length + 1):
            grow = [s for s in frontier if depth < length and not (s and s[-1] in eos_ids)]
            for s in [s for s in frontier if s not in set(grow)]:  # leaves: bins of their own
                part.probs[s] += frontier[s]
            if not grow:
                break
            rows = np.asarray(next_probs(grow), dtype=np.float64)  # [N, V]
            rows /= rows.sum(axis=-1, keepdims=True)
            grown: dict[Continuation, float] = {}
            for s, row in zip(grow, rows, strict=True):
                mass = frontier[s] * row  # [V] P(s + t)
                own = n * mass >= min_expected
                grown.update({(*s, int(t)): float(mass[t]) for t in np.flatnonzero(own)})
                part.groups_of[s] = group = _rank_groups(np.where(own, 0.0, row), groups)
                for g in range(groups):
                    if (in_g := group == g).any():
                        part.probs[RankBin(depth + 1, g)] += float(mass[in_g].sum())
            frontier = grown
        part.probs = dict(part.probs)
        return part

    def bin_of(self, seq: Continuation) -> Hashable:
        """The bin of a sampled continuation (a key absent from `probs` when it has probability 0)."""
        decided = self._walk(seq)
        return seq if decided is None else decided

    def decided(self, seq: Continuation) -> bool:
        """Whether the first tokens of a continuation already fix its bin (the rest cannot change it)."""
        return self._walk(seq) is not None

    def _walk(self, seq: Continuation) -> Hashable | None:
        """Follow seq down the tree: its bin, or None when seq is an expanded prefix (bin not fixed yet)."""
        for depth in range(len(seq) + 1):
            prefix = seq[:depth]
            if prefix not in self.groups_of:
                return prefix
            if depth == len(seq):
                return None
            if (g := int(self.groups_of[prefix][seq[depth]])) >= 0:
                return RankBin(depth + 1, g)
        raise AssertionError("unreachable")

    def rank_mass(self) -> dict[int, float]:
        """Probability held by the rank-quantile bins, per depth."""
        out: dict[int, float] = defaultdict(float)
        for b, p in self.probs.items():
            if isinstance(b, RankBin):
                out[b.depth] += p
        return dict(out)


def _rank_groups(row: np.ndarray, groups: int) -> np.ndarray:
    """[V] probabilities -> [V] group in 0..groups-1 by descending-mass quantile (midpoint rule); -1 where 0."""
    group = np.full(row.shape, -1, dtype=np.int64)
    order = np.argsort(-row, kind="stable")
    mass = row[order]
    total = mass.sum()
    if total <= 0:
        return group
    mid = (np.cumsum(mass) - mass / 2) / total  # [V] in (0, 1)
    group[order] = np.where(mass > 0, np.minimum((mid * groups).astype(np.int64), groups - 1), -1)
    return group
