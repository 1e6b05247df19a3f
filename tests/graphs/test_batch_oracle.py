"""graphs/batch_oracle.py: the padded batch's acceptance rule is graphs/oracle.py's, row by row, whatever the pads hold
(pad drafts equal to the target's argmax, pad q zero, k_b = 0 rows)."""

from __future__ import annotations

import numpy as np
import pytest

from specpack.graphs import oracle
from specpack.graphs.batch_oracle import verify_rows
from specpack.sampling import SamplingParams

PARAMS = [SamplingParams(), SamplingParams(1.0), SamplingParams(0.7, top_k=5), SamplingParams(1.0, top_p=0.8)]


@pytest.mark.parametrize("seed", range(6))
def test_each_row_is_the_oracle_on_its_own_drafts(seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch, k, vocab = 6, 4, 40
    counts = np.array([0, 1, 4, 2, 3, 4])
    logits = rng.normal(0, 2, (batch, k + 1, vocab)).astype(np.float32)         # [B, K+1, V]
    q = rng.dirichlet(np.full(vocab, 0.3), (batch, k)).astype(np.float32)      # [B, K, V]
    drafts = np.array([[rng.choice(vocab, p=q[b, i] / q[b, i].sum()) for i in range(k)] for b in range(batch)])
    for b in range(batch):  # pads that a rule without the count would accept
        drafts[b, counts[b]:] = np.argmax(logits[b, counts[b]:k], axis=-1)
        q[b, counts[b]:] = 0.0
    if seed % 2:  # greedy-friendly rows: the drafts are the target's argmaxes, so whole rows pass
        drafts[:] = np.argmax(logits[:, :k], axis=-1)
    u = rng.random((batch, k + 1)).astype(np.float32)                           # [B, K+1]
    params = [PARAMS[(b + seed) % len(PARAMS)] for b in range(batch)]
    n, nxt = verify_rows(logits, drafts, q, counts, u, params)
    for b in range(batch):
        c = counts[b]
        want = oracle.verify(logits[b, : c + 1], drafts[b, :c], q[b, :c], u[b, : c + 1], params[b])
        assert (int(n[b]), int(nxt[b])) == want, (b, c, params[b])
    assert (n <= counts).all()
