"""The ONNX heads against the numpy oracle on ONNX Runtime's CPU EP: identical tokens, counts and q."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto

from specpack.graphs import heads, oracle
from specpack.graphs.sampling_graph import TOP_P_TIERS
from specpack.sampling import SamplingParams

from .cases import LARGE_VOCABS, MODES, VOCABS, DraftCase, VerifyCase, cpu_session, draft_case, verify_case

CASES_PER_MODE = 3000
F32 = np.float32


@pytest.fixture(scope="module")
def draft_session() -> ort.InferenceSession:
    return cpu_session(heads.draft_head_model())


@pytest.fixture(scope="module")
def verify_session() -> ort.InferenceSession:
    return cpu_session(heads.verify_head_model())


def _vocab(rng: np.random.Generator) -> int:
    return int(rng.choice(LARGE_VOCABS)) if rng.random() < 0.02 else int(rng.choice(VOCABS))


def _needs_later_tier(logits: np.ndarray, params: SamplingParams) -> bool:
    """Whether top-p goes past its first candidate list (sampling_graph.top_p_cutoff's If) for these logits."""
    if params.greedy or params.top_p >= 1.0:
        return False
    x = logits / F32(params.temperature)  # [N, V]
    e = oracle.exp32(x - x.max(axis=-1, keepdims=True))
    e = np.where(x >= oracle.top_k_threshold(x, params.top_k), e, F32(0.0))
    probs = -np.sort(-(e / oracle.fsum(e)), axis=-1)  # [N, V] descending
    cum = np.cumsum(probs, axis=-1, dtype=F32)  # [N, V]
    vocab = x.shape[-1]
    first = params.top_k + 1 if 0 < params.top_k < vocab else min(vocab, TOP_P_TIERS[0])
    done = (cum[:, first - 1] >= F32(params.top_p)) | (probs[:, first - 1] == 0)
    return first < vocab and not done.all()


@pytest.mark.parametrize("mode", MODES)
def test_draft_head_matches_oracle(draft_session: ort.InferenceSession, mode: str) -> None:
    rng = np.random.default_rng(MODES.index(mode))
    mismatches, later_tier = [], 0
    for i in range(CASES_PER_MODE):
        case = draft_case(rng, mode, _vocab(rng))
        token, probs = draft_session.run(["token", "probs"], case.feeds())
        want_token, want_q = case.expected()
        if token.tolist() != [want_token] or not np.array_equal(probs[0], want_q):
            mismatches.append((i, case.params, case.logits.shape, int(token[0]), want_token))
        later_tier += _needs_later_tier(case.logits[0, -1:], case.params)
    assert not mismatches, f"{len(mismatches)} of {CASES_PER_MODE} differ, first: {mismatches[:3]}"
    if "top_p" in mode:
        assert later_tier >= 20, f"only {later_tier} cases exercised the top-p fallback tiers"


@pytest.mark.parametrize("mode", MODES)
def test_verify_head_matches_oracle(verify_session: ort.InferenceSession, mode: str) -> None:
    rng = np.random.default_rng(100 + MODES.index(mode))
    mismatches, later_tier, rejected = [], 0, 0
    for i in range(CASES_PER_MODE):
        k = int(rng.integers(0, 9))
        case = verify_case(rng, mode, _vocab(rng), k)
        n, next_token = verify_session.run(["n_accepted", "next_token"], case.feeds())
        want = case.expected()
        if (int(n[0]), int(next_token[0])) != want:
            mismatches.append((i, case.params, case.draft_probs.shape, (int(n[0]), int(next_token[0])), want))
        later_tier += _needs_later_tier(case.logits[0, -(k + 1) :], case.params)
        rejected += want[0] < k
    assert not mismatches, f"{len(mismatches)} of {CASES_PER_MODE} differ, first: {mismatches[:3]}"
    assert rejected >= CASES_PER_MODE // 10, "too few rejections: the residual path is barely tested"
    if "top_p" in mode:
        assert later_tier >= 20, f"only {later_tier} cases exercised the top-p fallback tiers"


@pytest.mark.parametrize("mode", ["greedy", "top_k_top_p", "mixed"])
def test_fp16_logits(mode: str) -> None:
    """fp16 logits are cast to fp32 first: the oracle on the fp32 cast agrees."""
    draft = cpu_session(heads.draft_head_model(logits_type=TensorProto.FLOAT16))
    verify = cpu_session(heads.verify_head_model(logits_type=TensorProto.FLOAT16))
    rng = np.random.default_rng(7)
    for _ in range(300):
        d = draft_case(rng, mode, _vocab(rng), dtype=np.float16)
        token, probs = draft.run(["token", "probs"], d.feeds())
        want_token, want_q = d.expected()
        assert int(token[0]) == want_token and np.array_equal(probs[0], want_q)
        v = verify_case(rng, mode, _vocab(rng), int(rng.integers(0, 9)), dtype=np.float16)
        n, next_token = verify.run(["n_accepted", "next_token"], v.feeds())
        assert (int(n[0]), int(next_token[0])) == v.expected()


@pytest.mark.parametrize("mode", ["temperature", "top_k_top_p", "top_p"])
def test_full_vocabulary(draft_session: ort.InferenceSession, verify_session: ort.InferenceSession,
                         mode: str) -> None:
    """V = 151,936 (Qwen2.5), k = 4, including a flat row whose top-1024 mass is far below top_p."""
    rng = np.random.default_rng(11)
    vocab, k = 151_936, 4
    for flat in (False, True):
        case = verify_case(rng, mode, vocab, k)
        if flat:
            case.logits[0, -1] = (rng.standard_normal(vocab) * 0.01).astype(F32)
        n, next_token = verify_session.run(["n_accepted", "next_token"], case.feeds())
        assert (int(n[0]), int(next_token[0])) == case.expected()
        d = DraftCase(case.logits, float(rng.random(dtype=F32)), case.params)
        token, probs = draft_session.run(["token", "probs"], d.feeds())
        want_token, want_q = d.expected()
        assert int(token[0]) == want_token and np.array_equal(probs[0], want_q)


def test_prefill_k0_draws_from_last_position(verify_session: ort.InferenceSession) -> None:
    """k = 0 (prefill, plain autoregressive step): n = 0 and the token is drawn from the last position."""
    rng = np.random.default_rng(3)
    params = SamplingParams(0.8, top_k=20, top_p=0.9)
    logits = rng.standard_normal((1, 6, 500)).astype(F32)
    for u in (0.0, 0.3, 0.999):
        case = VerifyCase(logits, rng.integers(0, 500, (1, 6)), np.zeros((1, 0, 500), F32),
                          np.array([[u]], F32), params)
        n, token = verify_session.run(["n_accepted", "next_token"], case.feeds())
        assert int(n[0]) == 0
        assert int(token[0]) == oracle.draft_step(logits[0, -1], u, params)[0]


LN2 = F32(np.log(2.0))  # exp32(-LN2) == 0.5 exactly: probabilities that sit exactly on the boundaries


@pytest.mark.parametrize(("top_p", "kept"), [(0.5, 1), (0.75, 2), (0.7500001, 4), (1e-6, 1)])
def test_top_p_boundary(draft_session: ort.InferenceSession, top_p: float, kept: int) -> None:
    """probs [1/2, 1/4, 1/8, 1/8]: keep token m iff the mass before it is < top_p, ties at the cutoff kept."""
    logits = np.array([[[0.0, -LN2, -2 * LN2, -2 * LN2]]], F32)
    case = DraftCase(logits, 0.999, SamplingParams(1.0, top_p=top_p))
    token, probs = draft_session.run(["token", "probs"], case.feeds())
    assert (probs[0] > 0).sum() == kept
    assert (int(token[0]), probs[0].tolist()) == (case.expected()[0], case.expected()[1].tolist())


@pytest.mark.parametrize(("u", "accepted"), [(0.4999, 1), (0.5, 0)])
def test_ratio_test_is_strict(verify_session: ort.InferenceSession, u: float, accepted: int) -> None:
    """p(x) = 1/4, q(x) = 1/2: accept iff u * q(x) < p(x)."""
    logits = np.full((1, 2, 8), -np.inf, F32)
    logits[0, 0, :4], logits[0, 1, 0] = 0.0, 0.0
    q = np.zeros((1, 1, 8), F32)
    q[0, 0, :2] = 0.5
    case = VerifyCase(logits, np.array([[1, 1]]), q, np.array([[u, 0.3]], F32), SamplingParams(1.0))
    n, token = verify_session.run(["n_accepted", "next_token"], case.feeds())
    assert (int(n[0]), int(token[0])) == case.expected()
    assert int(n[0]) == accepted


@pytest.mark.parametrize("u", [0.0, 0.5, float(np.nextafter(F32(1), F32(0))), 1.0])
def test_draw_extremes(draft_session: ort.InferenceSession, u: float) -> None:
    """u = 0 gives the first token with mass; u = 1.0 (out of contract) still a token with mass, not V-1."""
    logits = np.full((1, 1, 2000), -np.inf, F32)
    logits[0, 0, [3, 700, 1500]] = [1.0, 2.0, 0.5]
    case = DraftCase(logits, u, SamplingParams(1.0, top_k=2))
    token, _ = draft_session.run(["token", "probs"], case.feeds())
    assert int(token[0]) == case.expected()[0]
    assert int(token[0]) in (3, 700)


def test_empty_residual_falls_back_to_p(verify_session: ort.InferenceSession) -> None:
    """q = p * (1 + 1e-3) >= p everywhere: a rejection has no residual mass and draws from p."""
    rng = np.random.default_rng(9)
    params = SamplingParams(1.0, top_k=40)
    logits = rng.standard_normal((1, 2, 3000)).astype(F32)
    p = oracle.transform(logits[0], params)
    x = int(np.argmax(p[0]))
    for u_next in (0.1, 0.6, 0.95):
        case = VerifyCase(logits, np.array([[0, x]]), (p[:1] * F32(1.001))[None], np.array([[0.99995, u_next]], F32),
                          params)
        n, token = verify_session.run(["n_accepted", "next_token"], case.feeds())
        assert (int(n[0]), int(token[0])) == case.expected() == (0, oracle.draw(p[0], u_next))


@pytest.mark.parametrize("vocab", [1536, 1500])
def test_static_vocab(vocab: int) -> None:
    """Heads built for one V (as attach.py builds them): no padding when V is a multiple of SUM_BLOCK."""
    draft = cpu_session(heads.draft_head_model(vocab=vocab))
    verify = cpu_session(heads.verify_head_model(vocab=vocab))
    rng = np.random.default_rng(vocab)
    for i in range(400):
        mode = MODES[i % len(MODES)]
        d = draft_case(rng, mode, vocab)
        token, probs = draft.run(["token", "probs"], d.feeds())
        want_token, want_q = d.expected()
        assert int(token[0]) == want_token and np.array_equal(probs[0], want_q)
        v = verify_case(rng, mode, vocab, int(rng.integers(0, 9)))
        n, next_token = verify.run(["n_accepted", "next_token"], v.feeds())
        assert (int(n[0]), int(next_token[0])) == v.expected()
