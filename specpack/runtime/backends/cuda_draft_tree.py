"""The device buffers of a draft model's tree form on the cuda backend (docs/trees.md, "Trees drafted by the draft
model"); the host side is runtime/head_tree_rows.HeadTreeBuffers (hidden 0), shared with the cpu backend.

    DraftTreeSlot   per slot: own rows' positions [1, K] and mask [1, K, M], uploaded whole before an expansion; a
                    run's top-K tokens and log-probabilities [1, K + 1, K], read back after a tree run

Fixed buffers, viewed by W: a chain step binds W = 0 views (no own row: the chain form's rows), a tree's catch-up
the same binding (it is a chain step whose top-K is read back), an expansion of W nodes its W views; so a greedy run
is bound once per shape and captured (DeviceDraft in cuda.py; precaptured at load: cuda_precapture.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specpack import names
from specpack.runtime.device_buffers import DeviceArray, DeviceView


@dataclass(frozen=True)
class DraftTreeSlot:
    """One slot's device buffers of the draft's tree form (module docstring)."""

    positions: DeviceArray      # [1, K] int64: own rows' positions
    mask: DeviceArray           # [1, K, M] bool: own rows' masks
    tokens: DeviceArray         # [1, K + 1, K] int64: a run's top-K (own rows, then the last row)
    logprobs: DeviceArray       # [1, K + 1, K] fp32: their log-probabilities

    @classmethod
    def allocate(cls, width: int, max_len: int, device: str) -> DraftTreeSlot:
        return cls(positions=DeviceArray((1, width), np.int64, device),
                   mask=DeviceArray((1, width, max_len), np.bool_, device),
                   tokens=DeviceArray((1, width + 1, width), np.int64, device),
                   logprobs=DeviceArray((1, width + 1, width), np.float32, device))

    def inputs(self, w: int) -> dict[str, DeviceView]:
        """draft_positions [1, W] and draft_mask [1, W, M] (W = 0: a chain step, a tree's catch-up)."""
        return {names.DRAFT_POSITIONS: self.positions.view((1, w)),
                names.DRAFT_MASK: self.mask.view((1, w, self.mask.shape[2]))}

    def outputs(self, w: int) -> dict[str, DeviceView]:
        """tree_tokens and tree_logprobs [1, W + 1, K]."""
        k = self.tokens.shape[2]
        return {names.TREE_TOKENS: self.tokens.view((1, w + 1, k)),
                names.TREE_LOGPROBS: self.logprobs.view((1, w + 1, k))}
