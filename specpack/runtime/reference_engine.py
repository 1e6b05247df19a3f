"""The numpy reference backend: engines over a stateless logits function, with the oracle's sampling.

It runs anywhere and needs no graph, so the loop's logic (rollback, catch-up, caps, eos, statistics) and
the sampling math are tested on their own; a golden test holds it equal to the ONNX Runtime engines.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from specpack.graphs import oracle
from specpack.runtime.buffers import DecodeBuffers
from specpack.sampling import SamplingParams

LogitsFn = Callable[[np.ndarray], np.ndarray]  # ids [n] -> logits [n, V] (position i predicts token i+1)


def bigram_logits(table: np.ndarray) -> LogitsFn:
    """A model whose next-token logits depend on the last token only: table [V, V]."""
    return lambda ids: table[ids]


class _ReferenceModel:
    def __init__(self, logits_fn: LogitsFn, buffers: DecodeBuffers) -> None:
        self.logits_fn, self.buffers = logits_fn, buffers
        self.kv_length = 0
        self.calls = 0

    def rollback(self, length: int) -> None:
        self.kv_length = min(self.kv_length, length)

    def close(self) -> None:
        pass

    def _params(self) -> SamplingParams:
        b = self.buffers
        return SamplingParams(float(b.temperature[0]), int(b.top_k[0]), float(b.top_p[0]))

    def _logits(self, end: int) -> np.ndarray:
        """Logits of the positions ids[kv_length:end] (the cache is only bookkeeping here)."""
        self.calls += 1
        start, self.kv_length = self.kv_length, end
        return self.logits_fn(self.buffers.ids[0, :end])[start:end].astype(np.float32)  # [S, V]


class ReferenceDraftEngine(_ReferenceModel):
    def propose(self, end: int, slot: int) -> int:
        b = self.buffers
        token, q = oracle.draft_step(self._logits(end)[-1], float(b.draft_uniforms[slot]), self._params())
        b.draft_probs[0, slot] = q
        return token


class ReferenceTargetEngine(_ReferenceModel):
    def verify(self, end: int, k: int) -> tuple[int, int]:
        b = self.buffers
        logits = self._logits(end)[-(k + 1) :]  # [k+1, V]
        return oracle.verify(logits, b.ids[0, end - k : end], b.draft_probs[0, :k], b.verify_uniforms[0, : k + 1],
                             self._params())
