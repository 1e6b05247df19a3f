"""Sampling parameters and the random numbers they call for: greedy or not is decided here, once.

SamplingParams is validated once and used by the oracle, the graphs' inputs and the runtime alike;
Uniforms holds one request's random numbers, drawn only when the parameters sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specpack import names
from specpack.errors import SpecpackError

FP32_BELOW_ONE = 1.0 - 2.0**-25  # a top_p below it is < 1 in fp32 (from 1 - 2^-25 up, round to nearest gives 1.0)


@dataclass(frozen=True)
class SamplingParams:
    """The sampling transform, applied in transformers' order: temperature, then top-k, then top-p.

    temperature 0 is greedy (argmax); top_k 0 and top_p 1.0 disable those filters. Ties at the k-th
    logit and at the top-p cutoff are kept.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise SpecpackError("invalid temperature", expected="a finite number >= 0 (0 is greedy)", found=repr(t))
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise SpecpackError("invalid top_k", expected="an integer >= 0 (0 disables)", found=repr(k))
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or not 0.0 < p <= 1.0:
            raise SpecpackError("invalid top_p", expected="a number in (0, 1] (1.0 disables)", found=repr(p))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def filters(self, vocab: int) -> bool:
        """Whether top-k or top-p keeps fewer than the whole vocabulary, as the graphs read them (sampling_graph.transform:
        0 < top_k < V, or top_p < 1 in fp32). A sampling request that filters nothing runs on a device backend's plain
        sampling form (graphs/sampling_form.py)."""
        return 0 < self.top_k < vocab or self.top_p < FP32_BELOW_ONE  # per row per step: plain floats, no numpy

    def graph_inputs(self) -> dict[str, np.ndarray]:
        """The sampling inputs of both graphs (names.py), from these parameters and nothing else."""
        return {names.TEMPERATURE: np.array([self.temperature], np.float32),  # [1]
                names.TOP_K: np.array([self.top_k], np.int64),                 # [1]
                names.TOP_P: np.array([self.top_p], np.float32)}               # [1]


class Uniforms:
    """One request's uniform numbers (docs/contracts.md, "Randomness"), in buffers allocated once.

    Greedy parameters draw nothing (the graphs ignore the uniforms at temperature 0); sampling ones draw
    from numpy's Philox, seeded: the same seed gives the same tokens on every run and every backend.
    Whether anything is drawn follows from `params.greedy` alone, so the graphs' temperature and the
    host's random numbers cannot disagree.
    """

    def __init__(self, params: SamplingParams, k_max: int, generator: np.random.Generator | None = None,
                 seed: int | None = None) -> None:
        """`generator` (tests that share one across requests) or `seed`; neither: a fresh random seed."""
        if generator is not None and seed is not None:
            raise ValueError("pass a generator or a seed, not both")
        self.greedy = params.greedy
        self._rng = None if params.greedy else generator or np.random.Generator(np.random.Philox(seed))
        self.draft = np.zeros(k_max, np.float32)           # [k_max]      one per draft draw
        self.verify = np.zeros((1, k_max + 1), np.float32)  # [1, k_max+1] the k acceptance tests, then the next draw

    def draw(self, k: int) -> None:
        """The uniforms of one step with k drafts, in place: draft[:k], then verify[0, :k+1]."""
        if self._rng is not None:
            self._rng.random(out=self.draft[:k], dtype=np.float32)
            self._rng.random(out=self.verify[0, : k + 1], dtype=np.float32)
