"""Host buffers shared by the draft and the target engines, allocated once per loaded pack.

Draft tokens are written straight after the committed tokens in `ids`, so the verify input is a view
(`ids[cached:end]`), an accepted draft token is already in place, and nothing is copied per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specpack.sampling import SamplingParams


@dataclass
class DecodeBuffers:
    ids: np.ndarray            # int64 [1, max_len + k_max + 1]  committed tokens, then the k draft tokens
    positions: np.ndarray      # int64 [1, max_len + k_max + 1]  0, 1, 2, ... (position_ids are views)
    mask: np.ndarray           # int64 [1, max_len + k_max + 1]  all ones (attention_mask is a view)
    draft_probs: np.ndarray    # fp32 [1, k_max, V]  q of each draft token, written by the draft step
    draft_uniforms: np.ndarray  # fp32 [k_max]        one uniform per draft draw
    verify_uniforms: np.ndarray  # fp32 [1, k_max + 1] acceptance tests, then the next-token draw
    temperature: np.ndarray    # fp32 [1]
    top_k: np.ndarray          # int64 [1]
    top_p: np.ndarray          # fp32 [1]
    n_accepted: np.ndarray     # int64 [1]  verify output
    next_token: np.ndarray     # int64 [1]  verify output
    draft_token: np.ndarray    # int64 [1]  draft step output

    @classmethod
    def allocate(cls, max_len: int, k_max: int, vocab_size: int) -> DecodeBuffers:
        width = max_len + k_max + 1
        return cls(
            ids=np.zeros((1, width), np.int64),
            positions=np.arange(width, dtype=np.int64)[None, :],
            mask=np.ones((1, width), np.int64),
            draft_probs=np.zeros((1, k_max, vocab_size), np.float32),
            draft_uniforms=np.zeros(k_max, np.float32),
            verify_uniforms=np.zeros((1, k_max + 1), np.float32),
            temperature=np.zeros(1, np.float32),
            top_k=np.zeros(1, np.int64),
            top_p=np.ones(1, np.float32),
            n_accepted=np.zeros(1, np.int64),
            next_token=np.zeros(1, np.int64),
            draft_token=np.zeros(1, np.int64),
        )

    def set_sampling(self, params: SamplingParams) -> None:
        self.temperature[0] = params.temperature
        self.top_k[0] = params.top_k
        self.top_p[0] = params.top_p

    def draw_uniforms(self, rng: np.random.Generator, k: int) -> None:
        """Fill the uniforms of one speculative step in place (no allocation)."""
        rng.random(out=self.draft_uniforms[:k], dtype=np.float32)
        rng.random(out=self.verify_uniforms[0, : k + 1], dtype=np.float32)
