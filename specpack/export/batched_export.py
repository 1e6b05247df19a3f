"""The batched static form of a plain graph (docs/batching.md, "The batched graph form"): torch.onnx.export of the model
with batched_attention.py's attention. Its heads: graphs/attach.py's build_batched_verify_graph and
build_batched_greedy_graph; spec-export --max-batch writes both (export/pipeline.py).

    input_ids       [B, S]  ─┐
    position_ids    [B, S]  ─┤                                          ┌─> logits           [B, S, V]
    attention_mask  [B, M]  ─┼─> the model with an attention that      ─┤
    past_key_values.{i}.key ─┤      writes row b's rows [L_b, L_b + S)  └─> present.{i}.key  [B, kv_heads, M, head_dim]
    past_key_values.{i}.value┘      of the past in place                    present.{i}.value  (the past's buffers)

B, S and M are dynamic (dim_params batch_size, sequence_length, max_sequence_length); row b's mask holds ones at
[0, L_b + S). torch and transformers are imported by whoever imports this module: export-time only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specpack.dtypes import DTYPES, GRAPH_DTYPES
from specpack.errors import SpecpackError
from specpack.export import batched_attention as ba
from specpack.export import torch_export as te
from specpack.export.model_info import ModelInfo, read_model_info


def export_batched_graph(model_dir: Path, out_onnx: Path, dtype: str = "fp32") -> ModelInfo:
    """Export `model_dir` in the batched static form to `out_onnx` (+ `{name}.data`)."""
    if dtype not in DTYPES:
        raise SpecpackError(f"unsupported export dtype {dtype!r}", expected=f"one of {', '.join(DTYPES)}",
                            found=repr(dtype))
    model_dir, out_onnx = Path(model_dir), Path(out_onnx)
    info = read_model_info(model_dir)
    out_onnx.parent.mkdir(parents=True, exist_ok=True)
    state = ba.BatchedCacheState()
    te._register_static_attention(ba.make_batched_attention(state))
    model = te._load_model(model_dir, dtype, ba.ATTN_IMPLEMENTATION)
    program = te._export(_batched_forward(model, state), _example_inputs(info, dtype), _dynamic_shapes(info), info,
                         ba.TRANSLATIONS)
    del model
    te._save(program, out_onnx)
    return info


def _batched_forward(model: torch.nn.Module, state: ba.BatchedCacheState) -> torch.nn.Module:
    """forward(input_ids [B, S], position_ids [B, S], attention_mask [B, M], *past [B, H, M, D]) -> (logits,
    *present): the registered attention writes each layer's new rows into its past."""

    class BatchedForward(torch.nn.Module):
        def __init__(self, lm: torch.nn.Module):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                    *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
            state.begin(attention_mask, past)
            out = self.lm(input_ids=input_ids, position_ids=position_ids, use_cache=False)
            return (out.logits, *state.ordered_presents())  # [B, S, V], [B, H, M, D] ...

    return BatchedForward(model).eval()


def _example_inputs(info: ModelInfo, dtype: str) -> tuple[Any, ...]:
    """Tracing inputs: B = 2 rows of lengths L = 2 and 4, S = 3 new tokens each, M = 9 (no dim 0 or 1)."""
    batch, seq, max_len, lengths = 2, 3, 9, (2, 4)
    mask = torch.zeros(batch, max_len, dtype=torch.int64)
    for b, length in enumerate(lengths):
        mask[b, : length + seq] = 1
    kv = (batch, info.kv_heads, max_len, info.head_dim)
    return (
        torch.zeros(batch, seq, dtype=torch.int64),                                        # input_ids    [B, S]
        torch.stack([torch.arange(length, length + seq) for length in lengths]),           # position_ids [B, S]
        mask,                                                                              # mask         [B, M]
        *[torch.zeros(kv, dtype=getattr(torch, GRAPH_DTYPES[dtype].torch)) for _ in range(2 * info.num_layers)],
    )


def _dynamic_shapes(info: ModelInfo) -> tuple[Any, ...]:
    from torch.export import Dim

    batch, seq, max_len = Dim(te.BATCH), Dim(te.SEQ), Dim(te.MAX)
    return ({0: batch, 1: seq}, {0: batch, 1: seq}, {0: batch, 1: max_len},
            tuple([{0: batch, 2: max_len}] * (2 * info.num_layers)))
