"""Random cases for the heads: logits with -inf, ties, near-ties and flat rows; sampling parameters per mode.

`MODES` names the parameter families every head test covers; `draft_case` / `verify_case` make one case
(with draft tokens and q from the draft oracle, or adversarial q ~ p), `feeds` turns it into session inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from specpack.graphs import oracle
from specpack.sampling import SamplingParams

F32 = np.float32
MODES = ("greedy", "temperature", "top_k", "top_p", "top_k_top_p", "mixed")
# Not powers of two; above 1024 (first top-p tier) and 8192 (second) so every top-p tier runs.
VOCABS = (2, 7, 33, 100, 257, 1000, 1023, 1024, 1025, 1500, 2049, 3001)
LARGE_VOCABS = (8193, 12000)
TEMPERATURES = (1e-6, 1e-4, 1e-3, 0.05, 0.3, 0.7, 1.0, 1.5, 3.0, 20.0, 500.0)


def random_params(rng: np.random.Generator, mode: str, vocab: int) -> SamplingParams:
    """Sampling parameters of one mode; top_k includes 1, V-1, V and > V; top_p includes ~0 and ~1."""
    temperature = float(rng.choice(TEMPERATURES)) if mode == "mixed" else float(np.exp(rng.uniform(-3, 1.5)))
    top_k = int(rng.choice([1, 2, 5, 50, max(1, vocab - 1), vocab, vocab + 7, int(rng.integers(1, vocab + 1))]))
    top_p = float(rng.choice([1e-6, 0.1, 0.5, 0.9, 0.95, 0.999, 0.9999999, float(rng.uniform(0.01, 1.0))]))
    if mode == "greedy":
        return SamplingParams(0.0, top_k, top_p)  # filters are ignored when greedy
    if mode == "temperature":
        return SamplingParams(temperature)
    if mode == "top_k":
        return SamplingParams(temperature, top_k=top_k)
    if mode == "top_p":
        return SamplingParams(temperature, top_p=top_p)
    if mode == "top_k_top_p":
        return SamplingParams(temperature, top_k=top_k, top_p=top_p)
    # mixed: tiny and huge temperatures, each filter on or off
    return SamplingParams(temperature, top_k=top_k if rng.random() < 0.5 else 0,
                          top_p=top_p if rng.random() < 0.5 else 1.0)


def random_logits(rng: np.random.Generator, rows: int, vocab: int) -> np.ndarray:
    """[rows, V] fp32 logits of a random kind: normal, peaked, flat, tied, near-tied, with -inf entries."""
    kind = rng.choice(["normal", "peaked", "flat", "ties", "near_ties"])
    x = rng.standard_normal((rows, vocab)) * rng.uniform(0.3, 8.0)
    if kind == "peaked":
        x[:, rng.integers(0, vocab, 3)] += rng.uniform(5, 20)
    elif kind == "flat":  # top-1024 mass far below top_p: the later top-p tiers / full sort run
        x = rng.standard_normal((rows, vocab)) * rng.choice([0.0, 1e-3, 0.05])
    elif kind == "ties":  # few distinct values: ties at the k-th logit and at the top-p cutoff
        x = np.round(x / 2.0)
    x = x.astype(F32)
    if kind == "near_ties":  # pairs one ulp apart
        j = rng.integers(0, vocab, (rows, max(1, vocab // 4)))
        np.put_along_axis(x, j, np.nextafter(np.take_along_axis(x, j, -1), F32(np.inf)), -1)
    if rng.random() < 0.3:  # some -inf, never a whole row
        x[rng.random((rows, vocab)) < rng.uniform(0.0, 0.99)] = -np.inf
        x[np.arange(rows), rng.integers(0, vocab, rows)] = rng.standard_normal(rows).astype(F32)
    return x


def cpu_session(model: object) -> ort.InferenceSession:
    """An ONNX Runtime CPU session of a ModelProto, one thread."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]


def sampling_feeds(params: SamplingParams) -> dict[str, np.ndarray]:
    return {"temperature": np.array([params.temperature], F32), "top_k": np.array([params.top_k], np.int64),
            "top_p": np.array([params.top_p], F32)}


@dataclass
class DraftCase:
    logits: np.ndarray  # [1, S, V]
    u: float  # an fp32 value
    params: SamplingParams

    def feeds(self) -> dict[str, np.ndarray]:
        return {"logits": self.logits, "uniform": np.array([self.u], F32), **sampling_feeds(self.params)}

    def expected(self) -> tuple[int, np.ndarray]:
        return oracle.draft_step(self.logits[0, -1].astype(F32), float(self.u), self.params)


@dataclass
class VerifyCase:
    logits: np.ndarray  # [1, S, V]
    input_ids: np.ndarray  # [1, S], the last k are the draft tokens
    draft_probs: np.ndarray  # [1, k, V]
    uniforms: np.ndarray  # [1, k+1]
    params: SamplingParams

    def feeds(self) -> dict[str, np.ndarray]:
        return {"logits": self.logits, "input_ids": self.input_ids, "draft_probs": self.draft_probs,
                "uniforms": self.uniforms, **sampling_feeds(self.params)}

    def expected(self) -> tuple[int, int]:
        k = self.draft_probs.shape[1]
        drafts = self.input_ids[0, self.input_ids.shape[1] - k :]
        return oracle.verify(self.logits[0, -(k + 1) :].astype(F32), drafts, self.draft_probs[0],
                             self.uniforms[0], self.params)


def draft_case(rng: np.random.Generator, mode: str, vocab: int, dtype: type = F32) -> DraftCase:
    seq = int(rng.integers(1, 4))
    logits: np.ndarray = random_logits(rng, seq, vocab).astype(dtype)[None]
    return DraftCase(logits, float(rng.random(dtype=F32)), random_params(rng, mode, vocab))


def verify_case(rng: np.random.Generator, mode: str, vocab: int, k: int, dtype: type = F32) -> VerifyCase:
    """Draft tokens drawn by the draft oracle from draft logits that are unrelated to, near, or equal to
    the target's; or (adversarial) q = p * (1 + eps), a q whose residual max(0, p - q) is empty."""
    params = random_params(rng, mode, vocab)
    seq = k + 1 + int(rng.integers(0, 3))
    logits: np.ndarray = random_logits(rng, seq, vocab).astype(dtype)[None]  # [1, S, V]
    target = logits[0, -(k + 1) :].astype(F32)  # [k+1, V]
    relation = rng.choice(["independent", "near", "equal", "scaled"])
    drafts = np.zeros(k, np.int64)
    q = np.zeros((k, vocab), F32)
    for i in range(k):
        if relation == "independent":
            draft_logits = random_logits(rng, 1, vocab)[0]
        elif relation == "near":
            draft_logits = target[i] + (rng.standard_normal(vocab) * rng.choice([1e-6, 1e-3, 0.3])).astype(F32)
        else:
            draft_logits = target[i]
        drafts[i], q[i] = oracle.draft_step(draft_logits, float(rng.random(dtype=F32)), params)
        if relation == "scaled" and not params.greedy:  # p <= q everywhere: rejections have no residual
            q[i] = q[i] * F32(1.0 + float(rng.choice([1e-6, 1e-3, 0.1])))
    uniforms = rng.random((1, k + 1), dtype=F32)
    if relation == "scaled":
        uniforms[0, :k] = F32(1.0) - uniforms[0, :k] * F32(0.2)  # large u: reject often
    input_ids = rng.integers(0, vocab, (1, seq))
    input_ids[0, seq - k :] = drafts
    return VerifyCase(logits, input_ids, q[None], uniforms, params)
