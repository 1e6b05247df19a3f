"""The batched static form's attention (docs/batching.md, "The batched graph form"): standard ops, batch B, each row
with its own committed length. Export-time only (torch).

The cache of one layer is a pair of buffers [B, kv_heads, M, head_dim] written in place; row b's valid length is
data, its own mask row [b, :] (ones at [0, L_b + S)):

    total = ReduceSum(attention_mask, axis 1)          [B]   L_b + S          start = total - S        [B]
                                                                 (S summed from ones on the device: no host copy)
    present = ScatterND(past, (b, h, start_b + s) <- new k / v)                               [B, Hkv, M, D]
    scores  = q @ present_k^T * scale                                                         [B, Hkv, G*S, M]
              masked to key j <= start_b + i  (and j > start_b + i - window)                  row b, query i
    out     = softmax(scores, fp32) @ present_v                                               [B, S, Hq, D]

S is the same for every row (rows are right-padded to the longest: their pad rows are written past the row's
tokens, where nothing reads them before the next run overwrites them, as after a rollback). Grouped query heads
share a K / V head through a reshape of the query, as in static_attention.py's batch-1 standard form, whose ops
this form leaves untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from onnxscript import opset20

from specpack.export.static_attention import ATTN_IMPLEMENTATION

__all__ = ["ATTN_IMPLEMENTATION", "TRANSLATIONS", "BatchedCacheState", "make_batched_attention"]


@torch.library.custom_op("specpack::kv_write_rows", mutates_args=())
def kv_write_rows(past: torch.Tensor, new: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """past [B, H, M, D] with row b's rows [start_b, start_b + S) replaced by new[b] ([B, H, S, D]); start int64 [B]."""
    present = past.clone()
    for b in range(past.shape[0]):
        first = int(start[b])
        present[b, :, first : first + new.shape[2]] = new[b]
    return present


@kv_write_rows.register_fake
def _(past: torch.Tensor, new: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(past)


op: Any = opset20


def _kv_write_rows_onnx(past: Any, new: Any, start: Any) -> Any:
    """ScatterND(past, indices [B, H, S, 3] = (b, h, start_b + s), new [B, H, S, D]) -> [B, H, M, D]; Range over
    shapes only (static_attention.py says why), the data-dependent start added after."""
    batch, heads, seq = (op.Shape(new, start=i, end=i + 1) for i in range(3))  # [1] each
    one, zero = op.Constant(value_ints=[1]), op.Constant(value_ints=[0])
    grid = op.Concat(batch, heads, seq, one, axis=0)  # [B, H, S, 1]

    def arange(n: Any, shape: list[int]) -> Any:
        return op.Reshape(op.Range(op.Squeeze(zero), op.Squeeze(n), op.Squeeze(one)), op.Constant(value_ints=shape))

    b = arange(batch, [-1, 1, 1, 1])
    h = arange(heads, [1, -1, 1, 1])
    s = op.Add(arange(seq, [1, 1, -1, 1]), op.Reshape(start, op.Constant(value_ints=[-1, 1, 1, 1])))  # [B, 1, S, 1]
    indices = op.Concat(op.Expand(b, grid), op.Expand(h, grid), op.Expand(s, grid), axis=-1)  # [B, H, S, 3]
    return op.ScatterND(past, indices, new)


TRANSLATIONS: dict[Callable[..., Any], Callable[..., Any]] = {torch.ops.specpack.kv_write_rows.default: _kv_write_rows_onnx}


@dataclass
class BatchedCacheState:
    """What every layer's attention reads during one traced forward of the batched form."""

    past: tuple[torch.Tensor, ...] = ()   # key_0, value_0, key_1, ...   [B, Hkv, M, D] each
    mask: torch.Tensor | None = None      # [B, M] int64: row b ones at [0, L_b + S)
    presents: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def begin(self, mask: torch.Tensor, past: tuple[torch.Tensor, ...]) -> None:
        self.mask, self.past, self.presents = mask, past, {}

    def ordered_presents(self) -> list[torch.Tensor]:
        return [t for layer in sorted(self.presents) for t in self.presents[layer]]


def make_batched_attention(state: BatchedCacheState) -> Callable[..., tuple[torch.Tensor, None]]:
    """An attention function for transformers' AttentionInterface over the batched static cache."""

    def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                  **kwargs: Any) -> tuple[torch.Tensor, None]:
        # query [B, Hq, S, D]; key, value [B, Hkv, S, D] (rotary applied); attention_mask: unused (None)
        layer = int(module.layer_idx)  # type: ignore[arg-type]
        assert state.mask is not None, "BatchedCacheState.begin() was not called"
        scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
        # [B] L_b = (L_b + S) - S, S counted on the device (a sum of ones): the symbolic S is a host value, and the CUDA
        # EP copies a host value into a device op (a Memcpy node), which CUDA graph capture refuses
        start = state.mask.sum(dim=-1) - torch.ones_like(query[:, 0, :, 0], dtype=torch.int64).sum(dim=-1)
        present_key = torch.ops.specpack.kv_write_rows(state.past[2 * layer], key, start)
        present_value = torch.ops.specpack.kv_write_rows(state.past[2 * layer + 1], value, start)
        state.presents[layer] = (present_key, present_value)
        return _rows_attention(query, present_key, present_value, start, scale, kwargs.get("sliding_window")), None

    return attention


def _rows_attention(query: torch.Tensor, cache_key: torch.Tensor, cache_value: torch.Tensor, start: torch.Tensor,
                    scale: float, window: int | None) -> torch.Tensor:
    """query [B, Hq, S, D] (row b's queries at cache rows start_b ..) over the cache [B, Hkv, M, D] -> [B, S, Hq, D]."""
    batch, num_heads, seq, head_dim = query.shape
    kv_heads, max_len = cache_key.shape[1], cache_key.shape[2]
    groups = num_heads // kv_heads
    q = query.reshape(batch, kv_heads, groups * seq, head_dim)  # [B, Hkv, G*S, D]
    scores = torch.matmul(q, cache_key.transpose(2, 3)) * scale  # [B, Hkv, G*S, M]
    scores = scores.view(batch, kv_heads, groups, seq, max_len)
    row = start.view(-1, 1) + torch.arange(seq, device=query.device).view(1, seq)  # [B, S] cache row of each query
    col = torch.arange(max_len, device=query.device).view(1, 1, max_len)  # [1, 1, M]
    visible = col <= row.unsqueeze(-1)  # [B, S, M] causal within the row, nothing at or past L_b + S
    if window:
        visible = visible & (col > row.unsqueeze(-1) - window)
    scores = scores.masked_fill(~visible.view(batch, 1, 1, seq, max_len), torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores.float(), dim=-1).to(query.dtype).view(batch, kv_heads, groups * seq, max_len)
    out = torch.matmul(probs, cache_value)  # [B, Hkv, G*S, D]
    return out.view(batch, num_heads, seq, head_dim).transpose(1, 2)
