"""The oracle's semantics: transformers' warpers, documented tie handling, the draw, the acceptance rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specpack.graphs import oracle
from specpack.sampling import SamplingParams

F32 = np.float32
LN2 = F32(math.log(2.0))  # exp32(-LN2) == 0.5 and exp32(-2 * LN2) == 0.25 exactly


def _transformers_kept(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """transformers' own warpers, in generate()'s order: (kept mask [N, V], probabilities [N, V])."""
    import torch
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    scores = TemperatureLogitsWarper(params.temperature)(None, torch.from_numpy(logits.copy()))
    if params.top_k:
        scores = TopKLogitsWarper(params.top_k)(None, scores)
    if params.top_p < 1.0:
        scores = TopPLogitsWarper(params.top_p)(None, scores)
    return torch.isfinite(scores).numpy(), torch.softmax(scores, dim=-1).numpy()


def _near_top_p_boundary(logits: np.ndarray, params: SamplingParams) -> bool:
    """top_p within fp noise of a partial sum: the two cumsum formulations may round either way."""
    x = logits / F32(params.temperature)
    e = oracle.exp32(x - x.max(axis=-1, keepdims=True))
    e = np.where(x >= oracle.top_k_threshold(x, params.top_k), e, F32(0.0)).astype(np.float64)
    cum = np.cumsum(-np.sort(-e / e.sum(axis=-1, keepdims=True), axis=-1), axis=-1)
    return bool((np.abs(cum - params.top_p) < 1e-5).any())


def test_kept_set_and_probs_match_transformers_warpers() -> None:
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(400):
        vocab = int(rng.choice([5, 50, 1000, 3001]))
        params = SamplingParams(float(rng.choice([0.3, 0.7, 1.0, 2.0])),
                                top_k=int(rng.choice([0, 1, 3, 40, vocab + 1])),
                                top_p=float(rng.choice([1.0, 0.5, 0.9, rng.uniform(0.05, 0.999)])))
        logits = (rng.standard_normal((3, vocab)) * 3).astype(F32)  # continuous: no ties, no exp underflow
        if params.top_p < 1.0 and _near_top_p_boundary(logits, params):
            continue
        kept, probs = _transformers_kept(logits, params)
        ours = oracle.transform(logits, params)
        np.testing.assert_array_equal(ours > 0, kept)
        np.testing.assert_allclose(ours, probs, rtol=2e-5, atol=1e-7)
        checked += 1
    assert checked > 300


def test_top_k_keeps_ties_like_transformers() -> None:
    logits = np.array([[3.0, 2.0, 2.0, 2.0, 1.0]], F32)
    params = SamplingParams(1.0, top_k=2)
    kept, _ = _transformers_kept(logits, params)
    np.testing.assert_array_equal(oracle.transform(logits, params) > 0, kept)
    np.testing.assert_array_equal(kept, [[True, True, True, True, False]])


def test_top_p_keeps_ties_at_the_cutoff() -> None:
    """Documented difference: transformers' sort may cut inside a tie group at the cutoff; we keep it whole."""
    logits = np.array([[0.0, -LN2, -LN2, -LN2, -8.0]], F32)  # probs ~ [0.4, 0.2, 0.2, 0.2, 0.0001]
    params = SamplingParams(1.0, top_p=0.7)
    np.testing.assert_array_equal(oracle.transform(logits, params)[0] > 0, [True, True, True, True, False])
    assert _transformers_kept(logits, params)[0].sum() == 3  # one of the tied 0.2 tokens dropped


def test_top_p_boundary_is_strict() -> None:
    """Keep token m iff the mass before it is < top_p: with probs [1/2, 1/4, 1/8, 1/8] exactly, top_p = 1/2
    keeps one token and top_p = 3/4 keeps two."""
    logits = np.array([[0.0, -LN2, -2 * LN2, -2 * LN2]], F32)
    np.testing.assert_array_equal(oracle.transform(logits, SamplingParams(1.0))[0], [0.5, 0.25, 0.125, 0.125])
    assert (oracle.transform(logits, SamplingParams(1.0, top_p=0.5))[0] > 0).sum() == 1
    assert (oracle.transform(logits, SamplingParams(1.0, top_p=0.75))[0] > 0).sum() == 2
    assert (oracle.transform(logits, SamplingParams(1.0, top_p=0.7500001))[0] > 0).sum() == 4  # tie at 1/8


@pytest.mark.parametrize("params", [SamplingParams(0.0), SamplingParams(1.0), SamplingParams(1e-6),
                                    SamplingParams(0.7, top_k=3, top_p=0.5), SamplingParams(100.0, top_p=0.01)])
def test_all_but_one_logit_minus_inf(params: SamplingParams) -> None:
    logits = np.full((2, 300), -np.inf, F32)
    logits[0, 17], logits[1, 299] = -1e4, 5.0
    probs = oracle.transform(logits, params)
    assert not np.isnan(probs).any()
    np.testing.assert_array_equal(np.argwhere(probs > 0), [[0, 17], [1, 299]])
    assert oracle.draft_step(logits[0], 0.99, params)[0] == 17


def test_tiny_temperature_is_finite_and_peaked() -> None:
    logits = np.random.default_rng(1).standard_normal((4, 1000)).astype(F32)
    probs = oracle.transform(logits, SamplingParams(1e-6, top_p=0.9))
    assert np.isfinite(probs).all()
    np.testing.assert_array_equal(np.argmax(probs, axis=-1), np.argmax(logits, axis=-1))
    assert oracle.draw(probs[0], 0.999) == np.argmax(logits[0])


def test_top_k_at_or_above_vocab_is_a_no_op() -> None:
    logits = np.random.default_rng(2).standard_normal((3, 50)).astype(F32)
    plain = oracle.transform(logits, SamplingParams(0.8))
    for top_k in (50, 51, 10_000):
        np.testing.assert_array_equal(oracle.transform(logits, SamplingParams(0.8, top_k=top_k)), plain)


def test_greedy_is_one_hot_of_the_first_argmax() -> None:
    logits = np.array([[1.0, 3.0, 3.0, -np.inf]], F32)
    np.testing.assert_array_equal(oracle.transform(logits, SamplingParams(0.0)), [[0, 1, 0, 0]])


def test_draw_inverse_cdf() -> None:
    probs = np.array([0.0, 0.25, 0.0, 0.5, 0.25, 0.0], F32)
    assert oracle.draw(probs, 0.0) == 1  # first token with mass
    assert oracle.draw(probs, 0.2499) == 1
    assert oracle.draw(probs, 0.25) == 3  # cdf 0.25 <= u * total: past token 1
    assert oracle.draw(probs, 0.7499) == 3
    assert oracle.draw(probs, float(np.nextafter(F32(1), F32(0)))) == 4
    assert oracle.draw(probs, 1.0) == 4  # clamped to the last token with mass, not V-1
    assert oracle.draw(probs * F32(3.0), 0.5) == 3  # scale-free: residuals are not normalised


def test_fsum_and_fcdf() -> None:
    x = np.random.default_rng(3).random((2, 151_936)).astype(F32)
    np.testing.assert_allclose(oracle.fsum(x)[:, 0], x.astype(np.float64).sum(axis=-1), rtol=1e-6)
    cdf = oracle.fcdf(x[0])
    assert (np.diff(cdf) >= 0).all()
    np.testing.assert_allclose(cdf, np.cumsum(x[0].astype(np.float64)), rtol=1e-6)
    assert oracle.fcdf(np.ones(3, F32)).tolist() == [1, 2, 3]


def test_verify_greedy() -> None:
    target = np.array([[0, 5, 1], [4, 0, 0], [0, 0, 9]], F32)  # argmax 1, 0, 2
    params, q, u = SamplingParams(0.0), np.zeros((2, 3), F32), np.zeros(3, F32)
    assert oracle.verify(target, np.array([1, 0]), q, u, params) == (2, 2)  # all accepted, bonus argmax
    assert oracle.verify(target, np.array([1, 2]), q, u, params) == (1, 0)  # correction = argmax at mismatch
    assert oracle.verify(target, np.array([2, 0]), q, u, params) == (0, 1)
    assert oracle.verify(target[:1], np.array([], np.int64), q[:0], u[:1], params) == (0, 1)  # k = 0


def test_verify_ratio_test_is_strict() -> None:
    """p(x) = 1/4 (four equal logits), q(x) = 1/2: accept iff u * 1/2 < 1/4, i.e. u < 1/2."""
    target = np.full((2, 8), -np.inf, F32)
    target[0, :4] = 0.0
    target[1, 0] = 0.0
    q = np.array([[0.5, 0.5, 0, 0, 0, 0, 0, 0]], F32)
    params = SamplingParams(1.0)
    assert oracle.verify(target, np.array([1]), q, np.array([0.4999, 0.3], F32), params) == (1, 0)
    n, token = oracle.verify(target, np.array([1]), q, np.array([0.5, 0.3], F32), params)
    assert n == 0 and token in (2, 3)  # residual max(0, p - q) = 1/4 on tokens 2 and 3


def test_verify_empty_residual_falls_back_to_p() -> None:
    """q = p * (1 + eps) >= p everywhere: a rejection leaves no residual mass; draw from p instead."""
    rng = np.random.default_rng(4)
    params = SamplingParams(1.0)
    target = rng.standard_normal((2, 100)).astype(F32)
    p = oracle.transform(target, params)
    q = p[:1] * F32(1.001)
    x = int(np.argmax(q[0]))
    u = np.array([0.99995, 0.37], F32)  # u * q(x) >= p(x): rejected
    assert oracle.verify(target, np.array([x]), q, u, params) == (0, oracle.draw(p[0], 0.37))


def test_verify_all_accepted_draws_bonus_from_last_row() -> None:
    rng = np.random.default_rng(5)
    params = SamplingParams(0.9, top_k=10)
    target = rng.standard_normal((3, 64)).astype(F32)
    p = oracle.transform(target, params)
    drafts = np.argmax(p[:2], axis=-1)
    u = np.array([0.0, 0.0, 0.61], F32)  # u = 0 always accepts (p(x) > 0)
    assert oracle.verify(target, drafts, p[:2], u, params) == (2, oracle.draw(p[2], 0.61))
