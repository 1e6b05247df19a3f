"""graphs/batched_head.py: the batched verify head (ONNX Runtime, CPU) is bit-exact with graphs/batch_oracle.py and with
the batch-1 oracle row by row, on padded batches of random rows (every sampling mode of tests/graphs/cases.py, k_b from
0 to K, rows of different lengths right-padded, pads holding garbage the head must never read)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from specpack.graphs.batch_oracle import verify_rows
from specpack.graphs.batched_head import batched_verify_head_model
from specpack.sampling import SamplingParams

from .cases import MODES, VerifyCase, cpu_session, random_logits, verify_case

F32 = np.float32
BATCHES = 40  # per mode, of 1 to 5 rows


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    return cpu_session(batched_verify_head_model())


def batch_feeds(rng: np.random.Generator, cases: list[VerifyCase], vocab: int) -> dict[str, np.ndarray]:
    """One padded batch of `cases` (each one row): S = max S_b, K = max k_b; the pads random (logits, ids, q, u)."""
    batch = len(cases)
    seq = max(c.input_ids.shape[1] for c in cases)
    k = max(c.draft_probs.shape[1] for c in cases)
    logits = random_logits(rng, batch * seq, vocab).reshape(batch, seq, vocab)   # pads: garbage
    ids = rng.integers(0, vocab, (batch, seq))
    q = rng.dirichlet(np.ones(vocab), (batch, k)).astype(F32)                      # pads: a real-looking q
    u = rng.random((batch, k + 1), dtype=F32)
    for b, c in enumerate(cases):
        s_b, k_b = c.input_ids.shape[1], c.draft_probs.shape[1]
        logits[b, :s_b], ids[b, :s_b], q[b, :k_b], u[b, : k_b + 1] = c.logits[0], c.input_ids[0], c.draft_probs[0], c.uniforms[0]
    params = [c.params for c in cases]
    return {"logits": logits, "input_ids": ids, "draft_probs": q, "uniforms": u,
            "draft_counts": np.array([c.draft_probs.shape[1] for c in cases]),
            "token_counts": np.array([c.input_ids.shape[1] for c in cases]),
            "temperature": np.array([p.temperature for p in params], F32),
            "top_k": np.array([p.top_k for p in params], np.int64), "top_p": np.array([p.top_p for p in params], F32)}


def oracle_rows(feeds: dict[str, np.ndarray], params: list[SamplingParams]) -> tuple[np.ndarray, np.ndarray]:
    """batch_oracle.verify_rows on the rows each batch row verifies (its last k_b + 1 real positions)."""
    k = feeds["draft_probs"].shape[1]
    seq = feeds["input_ids"].shape[1]
    start = feeds["token_counts"] - feeds["draft_counts"] - 1
    pos = np.minimum(start[:, None] + np.arange(k + 1), seq - 1)                  # [B, K+1]
    logits = np.take_along_axis(feeds["logits"], pos[:, :, None], axis=1)          # [B, K+1, V]
    drafts = np.take_along_axis(feeds["input_ids"], pos[:, 1:], axis=1)            # [B, K]
    return verify_rows(logits, drafts, feeds["draft_probs"], feeds["draft_counts"], feeds["uniforms"], params)


@pytest.mark.parametrize("mode", MODES)
def test_batched_head_matches_the_oracles(session: ort.InferenceSession, mode: str) -> None:
    rng = np.random.default_rng(500 + MODES.index(mode))
    mismatches, rows, rejected = [], 0, 0
    for i in range(BATCHES):
        vocab = int(rng.choice([7, 33, 257, 1025]))
        modes = [mode if mode != "mixed" else str(rng.choice(MODES)) for _ in range(int(rng.integers(1, 6)))]
        cases = [verify_case(rng, m, vocab, int(rng.integers(0, 6))) for m in modes]
        feeds = batch_feeds(rng, cases, vocab)
        n, token = session.run(["n_accepted", "next_token"], feeds)
        got = list(zip(n.tolist(), token.tolist(), strict=True))
        alone = [c.expected() for c in cases]
        padded = list(zip(*(a.tolist() for a in oracle_rows(feeds, [c.params for c in cases])), strict=True))
        if got != alone or got != padded:
            mismatches.append((i, [c.params for c in cases], got, alone, padded))
        rows += len(cases)
        rejected += sum(a[0] < c.draft_probs.shape[1] for a, c in zip(alone, cases, strict=True))
    assert not mismatches, f"{len(mismatches)} of {BATCHES} batches differ, first: {mismatches[:2]}"
    assert rejected >= rows // 10, "too few rejections: the residual path is barely tested"
