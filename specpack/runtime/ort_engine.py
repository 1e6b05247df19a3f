"""Draft and target engines on ONNX Runtime: a pack graph, its KV cache and the shared buffers."""

from __future__ import annotations

import numpy as np

from specpack import names
from specpack.runtime.buffers import DecodeBuffers
from specpack.runtime.kv_cache import ConcatKVCache
from specpack.runtime.ort_session import OrtGraph


class _OrtModel:
    """What both engines share: bind the plain inputs for ids[kv_length:end] and the cache, then run."""

    def __init__(self, graph: OrtGraph, cache: ConcatKVCache, buffers: DecodeBuffers, num_layers: int) -> None:
        self.graph, self.cache, self.buffers = graph, cache, buffers
        self._past_names = names.kv_names(num_layers, "past")
        self._present_names = names.kv_names(num_layers, "present")

    @property
    def kv_length(self) -> int:
        return self.cache.length

    def rollback(self, length: int) -> None:
        self.cache.truncate(length)

    def close(self) -> None:
        self.graph.close()

    def _run(self, end: int, extra_inputs: dict[str, np.ndarray], extra_outputs: dict[str, np.ndarray]) -> None:
        b, start = self.buffers, self.cache.length
        inputs = {
            names.INPUT_IDS: b.ids[:, start:end],                # [1, S]
            names.POSITION_IDS: b.positions[:, start:end],       # [1, S]
            names.ATTENTION_MASK: b.mask[:, :end],               # [1, L + S]
            names.TEMPERATURE: b.temperature,
            names.TOP_K: b.top_k,
            names.TOP_P: b.top_p,
            **dict(zip(self._past_names, self.cache.past(), strict=True)),     # [1, H, L, D] each
            **extra_inputs,
        }
        outputs = {**dict(zip(self._present_names, self.cache.present(end), strict=True)), **extra_outputs}
        self.graph.run(inputs, outputs)
        self.cache.advance(end, keep=end)


class OrtDraftEngine(_OrtModel):
    """draft_step.onnx: S new tokens in, one drawn token and its distribution q out."""

    def propose(self, end: int, slot: int) -> int:
        b = self.buffers
        self._run(end,
                  {names.UNIFORM: b.draft_uniforms[slot : slot + 1]},                  # [1]
                  {names.TOKEN: b.draft_token, names.PROBS: b.draft_probs[:, slot]})  # [1], [1, V]
        return int(b.draft_token[0])


class OrtTargetEngine(_OrtModel):
    """verify.onnx: committed tokens not yet cached + k drafts in; n accepted and the next token out."""

    def verify(self, end: int, k: int) -> tuple[int, int]:
        b = self.buffers
        self._run(end,
                  {names.DRAFT_PROBS: b.draft_probs[:, :k], names.UNIFORMS: b.verify_uniforms[:, : k + 1]},
                  {names.N_ACCEPTED: b.n_accepted, names.NEXT_TOKEN: b.next_token})
        return int(b.n_accepted[0]), int(b.next_token[0])
