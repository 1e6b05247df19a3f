"""Speculative sampling on the numpy reference engines has the target's exact distribution (chi-square),
and the same test catches a draft whose q is not the distribution its token was drawn from."""

from __future__ import annotations

import numpy as np
import pytest

from specpack.graphs import oracle
from specpack.runtime.buffers import DecodeBuffers
from specpack.runtime.loop import generate_tokens
from specpack.runtime.reference_engine import ReferenceDraftEngine, ReferenceTargetEngine, bigram_logits
from specpack.sampling import SamplingParams
from tests.distribution import chi_square_pvalue, exact_continuations, transformed_next_probs

V, PROMPT, LENGTH, SAMPLES = 10, [3], 3, 10_000
SETTINGS = [SamplingParams(0.5), SamplingParams(1.0), SamplingParams(1.5), SamplingParams(1.0, top_k=5),
            SamplingParams(1.0, top_p=0.8)]


class _QBeforeTransform(ReferenceDraftEngine):
    """Broken on purpose: draws from the transformed distribution but reports q before the transform."""

    def propose(self, end: int, slot: int) -> int:
        token = super().propose(end, slot)
        logits = self.logits_fn(self.buffers.ids[0, :end])[-1].astype(np.float32)
        self.buffers.draft_probs[0, slot] = oracle.transform(logits[None], SamplingParams(1.0))[0]
        return token


def _tables() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    target = rng.normal(0, 1.5, (V, V)).astype(np.float32)
    draft = target + rng.normal(0, 1.0, (V, V)).astype(np.float32)  # agrees often, not always
    return target, draft


def _samples(draft_cls: type[ReferenceDraftEngine], params: SamplingParams, k: int) -> list[tuple[int, ...]]:
    target_table, draft_table = _tables()
    buffers = DecodeBuffers.allocate(16, 8, V)
    buffers.set_sampling(params)
    draft, target = draft_cls(bigram_logits(draft_table), buffers), ReferenceTargetEngine(bigram_logits(target_table), buffers)
    rng = np.random.Generator(np.random.Philox(1234))
    # k + 2 new tokens, so the first step really verifies k drafts (k is capped at the tokens still allowed);
    # the first LENGTH tokens of the output then have the exact LENGTH-token continuation distribution
    return [tuple(generate_tokens(draft, target, buffers, PROMPT, max(LENGTH, k + 2), k, frozenset(), rng)[0][:LENGTH])
            for _ in range(SAMPLES)]


def _exact(params: SamplingParams) -> dict[tuple[int, ...], float]:
    target_table, _ = _tables()
    return exact_continuations(transformed_next_probs(lambda ids: target_table[ids[-1]], params), PROMPT, LENGTH,
                               frozenset())


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_distribution_is_the_targets(params: SamplingParams, k: int) -> None:
    assert chi_square_pvalue(_samples(ReferenceDraftEngine, params, k), _exact(params)) > 1e-3


@pytest.mark.parametrize("params", [SamplingParams(0.5), SamplingParams(1.0, top_k=2), SamplingParams(1.0, top_p=0.6)], ids=str)
def test_catches_q_taken_before_the_transform(params: SamplingParams) -> None:
    assert chi_square_pvalue(_samples(_QBeforeTransform, params, 3), _exact(params)) < 1e-3
