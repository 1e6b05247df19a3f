"""The acceptance rule over a padded batch, in numpy: the oracle the batched verify graph must match (docs/batching.md,
"The batched graph form"). Not built into a graph yet.

Row b verifies k_b drafts (0 allowed) padded to K = max k_b; everything past k_b is padding the rule never reads:

    accepted[b, i] = test_i(b)  and  i < k_b                 (a pad draft is never accepted)
    n_b            = leading accepted of row b               (<= k_b)
    next_b         = draw(residual_b, u[b, k_b])             residual = max(0, p[b, n_b] - q[b, n_b]) with q zero in
                                                             rows >= k_b, so n_b = k_b draws the bonus from p[b, k_b]
    greedy rows:     next_b = argmax p[b, n_b]

The draw takes u[b, k_b] (the row's own last uniform, where the host drew it: Uniforms.draw(k_b)), not u[b, K].
Applied to a batch of one unpadded row it is graphs/oracle.py's `verify`, which tests/graphs/test_batch_oracle.py
checks row by row.
"""

from __future__ import annotations

import numpy as np

from specpack.graphs import oracle
from specpack.sampling import SamplingParams

F32 = np.float32


def verify_rows(target_logits: np.ndarray, draft_tokens: np.ndarray, draft_probs: np.ndarray, counts: np.ndarray,
                uniforms: np.ndarray, params: list[SamplingParams]) -> tuple[np.ndarray, np.ndarray]:
    """(n_accepted [B], next_token [B]) of a padded batch.

    target_logits [B, K+1, V]; draft_tokens [B, K] (pads: any token); draft_probs [B, K, V] (row b's first k_b rows
    used); counts k_b [B]; uniforms [B, K+1] (row b's first k_b + 1 used); params: each row's sampling transform."""
    logits = np.asarray(target_logits, dtype=F32)  # [B, K+1, V]
    batch, rows, vocab = logits.shape
    k = rows - 1
    x = np.asarray(draft_tokens, dtype=np.int64).reshape(batch, k)        # [B, K]
    counts = np.asarray(counts, dtype=np.int64)                            # [B]
    valid = np.arange(k)[None, :] < counts[:, None]                        # [B, K]
    q = np.where(valid[:, :, None], np.asarray(draft_probs, F32).reshape(batch, k, vocab), F32(0.0))  # [B, K, V]
    u = np.asarray(uniforms, dtype=F32).reshape(batch, rows)               # [B, K+1]
    n_out, next_out = np.zeros(batch, np.int64), np.zeros(batch, np.int64)
    for b in range(batch):  # the transform is per row (its own temperature, top-k, top-p)
        if params[b].greedy:
            best = np.argmax(logits[b], axis=-1)                           # [K+1]
            accepted = (x[b] == best[:k]) & valid[b]                       # [K]
            n = int(np.argmin(accepted)) if not accepted.all() else k
            n_out[b], next_out[b] = n, best[n]
            continue
        p = oracle.transform(logits[b], params[b])                         # [K+1, V]
        i = np.arange(k)
        accepted = (u[b, :k] * q[b, i, x[b]] < p[i, x[b]]) & valid[b]      # [K]: q >= p accept w.p. p/q; pads never
        n = int(np.argmin(accepted)) if not accepted.all() else k
        q_n = q[b, n] if n < k else np.zeros(vocab, F32)                   # rows >= k_b of q are zero: the bonus
        residual = np.maximum(p[n] - q_n, F32(0.0))                        # [V] unnormalised
        if residual.max() == 0.0:
            residual = p[n]
        n_out[b], next_out[b] = n, oracle.draw(residual, float(u[b, counts[b]]))
    return n_out, next_out
