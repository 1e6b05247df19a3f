"""Numpy reference of the sampling transform, the draw and the acceptance rule.

The test oracle for every graph and backend (docs/contracts.md, "Acceptance" and "Randomness"). Everything is
fp32, and every rounding step is pinned down so that the ONNX heads (sampling_graph.py, heads.py) agree
with it bit for bit on ONNX Runtime's CPU EP:

- exp is computed in fp64 and rounded once to fp32 (`exp32`): ONNX Runtime's fp32 Exp and numpy's differ
  by up to 3 ulp on a quarter of inputs, which moves inverse-CDF draws; fp64 exp rounds identically.
- sums have a fixed order (`fsum`, `fcdf`) built from sequential cumulative sums, which ONNX CumSum
  reproduces exactly; a pairwise or SIMD reduction rounds differently. Blocks of SUM_BLOCK tokens keep
  the graph's CumSum on its fast axis (a plain sequential CumSum over V costs ~1.2 ms a row there);
  128 divides the common vocabularies (151,936, 128,256, 32,000, 256,000), so nothing is padded.

Logits are fp32 [N, V], finite or -inf, with at least one finite value per row.
"""

from __future__ import annotations

import numpy as np

from specpack.sampling import SamplingParams

F32 = np.float32
NEG_INF = F32(-np.inf)
SUM_BLOCK = 128  # B: tokens per block in fsum / fcdf


def exp32(x: np.ndarray) -> np.ndarray:
    """exp rounded once to fp32 (computed in fp64); exp(-inf) = 0."""
    return np.exp(x.astype(np.float64)).astype(F32)


def _blocks(x: np.ndarray) -> np.ndarray:
    """[N, V] -> [N, A, B], zero-padded to A = ceil(V / B) blocks of B consecutive tokens (+0 is exact)."""
    n, vocab = x.shape
    pad = -vocab % SUM_BLOCK
    return np.pad(x, ((0, 0), (0, pad))).reshape(n, -1, SUM_BLOCK)


def fsum(x: np.ndarray) -> np.ndarray:
    """fp32 sum over the last axis in a fixed order, keepdims: [N, V] -> [N, 1].

    Column b of the [A, B] block matrix is summed sequentially over the blocks, then the B column sums
    sequentially.
    """
    columns = np.cumsum(_blocks(x), axis=1, dtype=F32)[:, -1]  # [N, B]
    return np.cumsum(columns, axis=-1, dtype=F32)[:, -1:]  # [N, 1]


def fcdf(x: np.ndarray) -> np.ndarray:
    """fp32 inclusive cumulative sum in token order, blocked: [V] -> [V] (non-decreasing for x >= 0).

    Each block of B tokens is summed sequentially, then offset by the sequential sum of the blocks
    before it.
    """
    within = np.cumsum(_blocks(x[None])[0], axis=-1, dtype=F32)  # [A, B] prefix inside each block
    totals = np.cumsum(within[:, -1], dtype=F32)  # [A] inclusive over blocks
    offsets = np.concatenate([np.zeros(1, F32), totals[:-1]])  # [A] exclusive over blocks
    return (within + offsets[:, None]).reshape(-1)[: len(x)]  # [V]


def top_k_threshold(x: np.ndarray, top_k: int) -> np.ndarray:
    """The k-th largest logit of each row ([N, V] -> [N, 1]); -inf when top-k is off (0, or >= V)."""
    vocab = x.shape[-1]
    if top_k == 0 or top_k >= vocab:
        return np.full((len(x), 1), NEG_INF)
    return np.sort(x, axis=-1)[:, vocab - top_k : vocab - top_k + 1]  # [N, 1]


def top_p_cutoff(x: np.ndarray, probs: np.ndarray, top_p: float) -> np.ndarray:
    """The smallest logit top-p keeps, per row: logits [N, V], their probabilities [N, V] -> [N, 1].

    transformers' TopPLogitsWarper: in descending order keep token m iff the probability mass before m
    is < top_p. So the cutoff is the logit at the first descending index c whose inclusive cumsum reaches
    top_p; every token with logit >= cutoff is kept (ties at the cutoff too). c is clamped to V-1: when
    fp rounding keeps the total below top_p, everything is kept.
    """
    order = np.argsort(-x, axis=-1, kind="stable")  # [N, V] descending (tie order changes no partial sum)
    sorted_x = np.take_along_axis(x, order, axis=-1)  # [N, V]
    cum = np.cumsum(np.take_along_axis(probs, order, axis=-1), axis=-1, dtype=F32)  # [N, V] inclusive
    c = np.minimum((cum < F32(top_p)).sum(axis=-1, keepdims=True), x.shape[-1] - 1)  # [N, 1]
    return np.take_along_axis(sorted_x, c, axis=-1)  # [N, 1]


def transform(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Sampling distribution of each row: temperature, top-k, top-p, softmax (transformers' order).

    [N, V] fp32 logits -> [N, V] fp32 probabilities. Greedy (temperature 0): one-hot of the argmax (first
    index among ties). Top-k and top-p both keep the tokens whose logit reaches a threshold, so they
    combine into one: keep x >= max(k-th largest, top-p cutoff of the top-k distribution).
    """
    logits = np.asarray(logits, dtype=F32)  # [N, V]
    if params.greedy:
        probs = np.zeros_like(logits)  # [N, V]
        probs[np.arange(len(logits)), np.argmax(logits, axis=-1)] = 1.0
        return probs
    x = logits / F32(params.temperature)  # [N, V] temperature
    e = exp32(x - x.max(axis=-1, keepdims=True))  # [N, V] unnormalised softmax, max 1
    threshold = top_k_threshold(x, params.top_k)  # [N, 1] top-k
    if params.top_p < 1.0:
        e_k = np.where(x >= threshold, e, F32(0.0))  # [N, V] the top-k distribution, unnormalised
        cutoff = top_p_cutoff(x, e_k / fsum(e_k), params.top_p)  # [N, 1]
        threshold = np.maximum(threshold, cutoff)  # top-p
    e = np.where(x >= threshold, e, F32(0.0))  # [N, V]
    return e / fsum(e)  # [N, V] softmax over the kept tokens: exp(x - max) / sum


def draw(probs: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from an (unnormalised) distribution [V] with a uniform u in [0, 1).

    token = first index whose cdf exceeds u * cdf[-1]: the fp32 cdf over a large vocabulary ends near
    0.9998, not 1, and a residual is not normalised at all (the draw is scale-free). Clamped to the last
    token with mass (rather than V-1), so even u == 1.0 never returns a zero-probability token.
    """
    cdf = fcdf(np.asarray(probs, dtype=F32))  # [V]
    threshold = F32(u) * cdf[-1]
    token = int((cdf <= threshold).sum())  # number of cdf entries <= u * total
    last = int((cdf < cdf[-1]).sum())  # the first index where the cdf reaches its total
    return min(token, last)


def draft_step(logits: np.ndarray, u: float, params: SamplingParams) -> tuple[int, np.ndarray]:
    """One draft token from the last position's logits [V], and q [V]: exactly the distribution it came from."""
    q = transform(np.asarray(logits, dtype=F32)[None], params)[0]  # [V]
    token = int(np.argmax(q)) if params.greedy else draw(q, u)
    return token, q


def verify(target_logits: np.ndarray, draft_tokens: np.ndarray, draft_probs: np.ndarray, uniforms: np.ndarray,
           params: SamplingParams) -> tuple[int, int]:
    """Exact rejection sampling (Leviathan et al. 2023, Chen et al. 2023): (n_accepted, next_token).

    target_logits [k+1, V]: the target at the k drafted positions and one more; draft_tokens x [k];
    draft_probs q [k, V], the distributions x was drawn from; uniforms u [k+1]: u_0..u_{k-1} for the
    acceptance tests, u_k for the next token.
    """
    target_logits = np.asarray(target_logits, dtype=F32)  # [k+1, V]
    x = np.asarray(draft_tokens, dtype=np.int64)  # [k]
    k = len(x)
    if params.greedy:
        return greedy_verify(np.argmax(target_logits, axis=-1), x)

    p = transform(target_logits, params)  # [k+1, V] target distributions
    q = np.asarray(draft_probs, dtype=F32).reshape(k, p.shape[-1])  # [k, V]
    u = np.asarray(uniforms, dtype=F32)  # [k+1]
    i = np.arange(k)
    # accept x_i iff u_i < p_i(x_i) / q_i(x_i), without the division: q_i(x_i) > 0 as x_i was drawn from q_i.
    # q >= p: accept with probability p/q;  q < p: always accept.
    accepted = u[:k] * q[i, x] < p[i, x]  # [k]
    n = _leading_true(accepted)
    # Next token from normalize(max(0, p_n - q_n)) at the first rejection n < k. With q padded by a zero
    # row, n == k gives max(0, p_k - 0) = p_k, the bonus token's distribution: one code path.
    q_ext = np.concatenate([q, np.zeros((1, p.shape[-1]), dtype=F32)])  # [k+1, V]
    residual = np.maximum(p[n] - q_ext[n], F32(0.0))  # [V] unnormalised: draw() is scale-free
    if residual.max() == 0.0:  # p_n <= q_n everywhere (fp rounding when p ~ q): no mass, fall back to p_n
        residual = p[n]
    return n, draw(residual, float(u[k]))


def greedy_verify(best: np.ndarray, draft_tokens: np.ndarray) -> tuple[int, int]:
    """The greedy acceptance test from the target's argmaxes best [k+1] at the k drafted positions and one more
    (what follows the first mismatch does not matter): (n_accepted, next_token)."""
    x = np.asarray(draft_tokens, dtype=np.int64)  # [k]
    n = _leading_true(x == np.asarray(best[: len(x)]))  # accept while x_i == argmax p_i
    return n, int(best[n])  # argmax at the first mismatch, or the bonus argmax


def _leading_true(flags: np.ndarray) -> int:
    """Number of leading True values in a [k] bool array."""
    return int((np.cumsum(~flags) == 0).sum())
