"""Sampling parameters: validated once, used by the oracle, the graphs' inputs and the runtime alike."""

from __future__ import annotations

import math
from dataclasses import dataclass

from specpack.errors import SpecpackError


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
