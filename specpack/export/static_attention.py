"""Attention over a static KV cache, for the torch export of the static graph form (torch_export.py).

The cache of one layer is a pair of buffers [1, kv_heads, M, head_dim], M = max_len, that the graph reads
and writes in place (the runtime binds present.* onto the past.* buffers). The valid length is data: the
static attention mask [1, M] holds ones at [0, L + S) and zeros after (onnxruntime-genai's static mask),
so every run over S new tokens has the same shapes, whatever L is.

    total = ReduceSum(attention_mask)         L + S        start = total - S        L
    standard (default ONNX ops; any head size, TensorRT):
        present = ScatterND(past, rows [start, start + S) <- new k / v)           [1, Hkv, M, D]
        scores  = q @ present_k^T * scale                                         [1, Hkv, G*S, M]
                  masked to key j <= start + i  (and j > start + i - window)      query row i
        out     = softmax(scores, fp32) @ present_v                               [1, S, Hq, D]
    gqa (com.microsoft.GroupQueryAttention, head_dim % 8 == 0):
        out, present_k, present_v = GroupQueryAttention(q, k, v, past_k, past_v,
                                        seqlens_k = total - 1, total_sequence_length = M)
    gqa with the rotary inside (a draft head's static step: export/head_export.py): the same op with do_rotary 1 and
        cos / sin caches [max_len, D / 2]; query and key go in before the rotary (group_query_attention_rotary)
    token trees (the tree form, torch_export.py): the standard form ANDs tree_allowed [S, M] into its mask; the gqa
    form passes tree_bias [1, 1, S, M] (0 / the dtype's lowest) as GroupQueryAttention's attention_bias

Rows at or beyond L + S are never read, so a rollback is a length update. ScatterND writes in place when
its data input and its output are one buffer (ONNX Runtime's CPU and CUDA kernels skip the copy when the
pointers are equal), and GroupQueryAttention shares past and present when they are one buffer
(past_present_share_buffer); tests/export/test_static_export.py checks both by write-protecting every
other page of the cache.

transformers calls `make_attention(state)` through its attention interface (query / key / value after the
rotary embedding, no cache object); the layer's past buffers and the mask come from `state`. The two
custom torch ops below become exactly the ONNX nodes above through `TRANSLATIONS`.
torch is imported by whoever imports this module: export-time only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from onnx.defs import OpSchema
from onnxscript import opset20
from onnxscript.values import Op, Opset

from specpack.errors import SpecpackError

ATTN_IMPLEMENTATION = "specpack_static"  # the name registered with transformers' AttentionInterface


# ---------------------------------------------------------------------------------------------- torch ops


@torch.library.custom_op("specpack::kv_write", mutates_args=())
def kv_write(past: torch.Tensor, new: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """past [1, H, M, D] with rows [start, start + S) replaced by new [1, H, S, D]; start int64 [1]."""
    present = past.clone()
    first = int(start[0])
    present[:, :, first : first + new.shape[2]] = new
    return present


@kv_write.register_fake
def _(past: torch.Tensor, new: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(past)


@torch.library.custom_op("specpack::group_query_attention", mutates_args=())
def group_query_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_key: torch.Tensor,
                          past_value: torch.Tensor, seqlens_k: torch.Tensor, num_heads: int, kv_num_heads: int,
                          scale: float, local_window_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GroupQueryAttention's contract in torch: query [1, S, Hq*D], key / value [1, S, Hkv*D] (BSNH), caches
    [1, Hkv, M, D] (BNSH), seqlens_k int32 [1] = L + S - 1 -> out [1, S, Hq*D], present_key, present_value."""
    batch, seq, _ = query.shape
    head_dim = past_key.shape[3]
    q = query.view(batch, seq, num_heads, head_dim).transpose(1, 2)  # [1, Hq, S, D]
    k = key.view(batch, seq, kv_num_heads, head_dim).transpose(1, 2)  # [1, Hkv, S, D]
    v = value.view(batch, seq, kv_num_heads, head_dim).transpose(1, 2)
    start = seqlens_k.to(torch.int64) + 1 - seq  # [1]
    window = local_window_size if local_window_size >= 0 else None  # the last `window` keys, as transformers
    out, present_key, present_value = standard_attention(q, k, v, past_key, past_value, start, scale, window)
    return out.reshape(batch, seq, num_heads * head_dim), present_key, present_value


@group_query_attention.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_key: torch.Tensor, past_value: torch.Tensor,
      seqlens_k: torch.Tensor, num_heads: int, kv_num_heads: int, scale: float, local_window_size: int
      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(query), torch.empty_like(past_key), torch.empty_like(past_value)


@torch.library.custom_op("specpack::group_query_attention_bias", mutates_args=())
def group_query_attention_bias(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_key: torch.Tensor,
                               past_value: torch.Tensor, seqlens_k: torch.Tensor, attention_bias: torch.Tensor,
                               num_heads: int, kv_num_heads: int,
                               scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """group_query_attention with GroupQueryAttention's attention_bias [1, 1, S, M] (0 or the dtype's lowest: the
    token tree's mask, tree_bias) added to the causal scores; no window."""
    batch, seq, _ = query.shape
    head_dim = past_key.shape[3]
    q = query.view(batch, seq, num_heads, head_dim).transpose(1, 2)  # [1, Hq, S, D]
    k = key.view(batch, seq, kv_num_heads, head_dim).transpose(1, 2)  # [1, Hkv, S, D]
    v = value.view(batch, seq, kv_num_heads, head_dim).transpose(1, 2)
    start = seqlens_k.to(torch.int64) + 1 - seq  # [1]
    out, present_key, present_value = standard_attention(q, k, v, past_key, past_value, start, scale, None,
                                                attention_bias[0, 0] == 0)
    return out.reshape(batch, seq, num_heads * head_dim), present_key, present_value


@group_query_attention_bias.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_key: torch.Tensor, past_value: torch.Tensor,
      seqlens_k: torch.Tensor, attention_bias: torch.Tensor, num_heads: int, kv_num_heads: int, scale: float
      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(query), torch.empty_like(past_key), torch.empty_like(past_value)


@torch.library.custom_op("specpack::group_query_attention_rotary", mutates_args=())
def group_query_attention_rotary(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_key: torch.Tensor,
                                 past_value: torch.Tensor, seqlens_k: torch.Tensor, cos_cache: torch.Tensor,
                                 sin_cache: torch.Tensor, num_heads: int, kv_num_heads: int,
                                 scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """group_query_attention with the rotary inside (GroupQueryAttention's do_rotary 1, rotary_interleaved 0: the
    rotate-half form): query / key [1, S, H*D] before the rotary; row i sits at position start + i, start = seqlens_k
    + 1 - S (its cache row), and is rotated by row start + i of cos_cache / sin_cache [max_len, D / 2]."""
    batch, seq, _ = query.shape
    head_dim = past_key.shape[3]
    start = seqlens_k.to(torch.int64) + 1 - seq  # [1]
    positions = start + torch.arange(seq, device=query.device)  # [S]
    cos, sin = cos_cache[positions], sin_cache[positions]  # [S, D / 2]
    q = _rotate_half_form(query.view(batch, seq, num_heads, head_dim).transpose(1, 2), cos, sin)  # [1, Hq, S, D]
    k = _rotate_half_form(key.view(batch, seq, kv_num_heads, head_dim).transpose(1, 2), cos, sin)  # [1, Hkv, S, D]
    v = value.view(batch, seq, kv_num_heads, head_dim).transpose(1, 2)
    out, present_key, present_value = standard_attention(q, k, v, past_key, past_value, start, scale, None)
    return out.reshape(batch, seq, num_heads * head_dim), present_key, present_value


@group_query_attention_rotary.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_key: torch.Tensor, past_value: torch.Tensor,
      seqlens_k: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor, num_heads: int, kv_num_heads: int,
      scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(query), torch.empty_like(past_key), torch.empty_like(past_value)


def _rotate_half_form(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [1, H, S, D] rotated: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), halves of D; cos / sin [S, D / 2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rotary_caches(inv_freq: torch.Tensor, max_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin [max_len, D / 2] of positions 0..max_len-1 (angles in fp32, then cast, as the eager rotary does)."""
    angles = torch.arange(max_len, dtype=torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


# ----------------------------------------------------------------------------------- their ONNX translations

op: Any = opset20  # untyped here: onnxscript's typed opsets do not follow the int64 shape arithmetic below
_MSFT = Opset("com.microsoft", 1)
_GQA_SCHEMA = OpSchema(
    "GroupQueryAttention", "com.microsoft", 1,
    inputs=[OpSchema.FormalParameter(name, type_str) for name, type_str in (
        ("query", "T"), ("key", "T"), ("value", "T"), ("past_key", "T"), ("past_value", "T"),
        ("seqlens_k", "M"), ("total_sequence_length", "M"))],
    outputs=[OpSchema.FormalParameter(name, "T") for name in ("output", "present_key", "present_value")],
    type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], ""),
                      ("M", ["tensor(int32)"], "")],
    attributes=[OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, ""),
                OpSchema.Attribute("kv_num_heads", OpSchema.AttrType.INT, ""),
                OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, ""),
                OpSchema.Attribute("local_window_size", OpSchema.AttrType.INT, "")],
)
_GroupQueryAttention = Op(_MSFT, "GroupQueryAttention", _GQA_SCHEMA)
_OPTIONAL = OpSchema.FormalParameterOption.Optional
_GQA_BIAS_SCHEMA = OpSchema(  # the same op with its optional inputs up to attention_bias (ONNX Runtime's order)
    "GroupQueryAttention", "com.microsoft", 1,
    inputs=[*_GQA_SCHEMA.inputs, *(OpSchema.FormalParameter(name, type_str, param_option=_OPTIONAL)
                                   for name, type_str in (("cos_cache", "T"), ("sin_cache", "T"),
                                                          ("position_ids", "P"), ("attention_bias", "T")))],
    outputs=list(_GQA_SCHEMA.outputs),
    type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], ""),
                      ("M", ["tensor(int32)"], ""), ("P", ["tensor(int64)"], "")],
    attributes=[OpSchema.Attribute(name, OpSchema.AttrType.INT, "") for name in ("num_heads", "kv_num_heads")]
    + [OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, "")],
)
_GroupQueryAttentionBias = Op(_MSFT, "GroupQueryAttention", _GQA_BIAS_SCHEMA)
_GQA_ROTARY_SCHEMA = OpSchema(  # the same op with the rotary inside: cos_cache / sin_cache in, do_rotary 1
    "GroupQueryAttention", "com.microsoft", 1,
    inputs=[*_GQA_SCHEMA.inputs, *(OpSchema.FormalParameter(name, "T") for name in ("cos_cache", "sin_cache"))],
    outputs=list(_GQA_SCHEMA.outputs),
    type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], ""),
                      ("M", ["tensor(int32)"], "")],
    attributes=[OpSchema.Attribute(name, OpSchema.AttrType.INT, "")
                for name in ("num_heads", "kv_num_heads", "do_rotary", "rotary_interleaved")]
    + [OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, "")],
)
_GroupQueryAttentionRotary = Op(_MSFT, "GroupQueryAttention", _GQA_ROTARY_SCHEMA)


def _kv_write_onnx(past: Any, new: Any, start: Any) -> Any:
    """ScatterND(past, indices [1, H, S, 3] = (0, h, start + s), new [1, H, S, D]) -> [1, H, M, D].

    Range reads only shapes (host values on every EP); the data-dependent start is added after, on the device:
    a Range over `start` would make ONNX Runtime's CUDA EP copy it to the host mid-graph (no CUDA graph)."""
    heads = op.Shape(new, start=1, end=2)  # [1]
    seq = op.Shape(new, start=2, end=3)  # [1]
    one, zero = op.Constant(value_ints=[1]), op.Constant(value_ints=[0])
    grid = op.Concat(one, heads, seq, one, axis=0)  # [1, H, S, 1]
    h = op.Reshape(op.Range(op.Squeeze(zero), op.Squeeze(heads), op.Squeeze(one)), op.Constant(value_ints=[1, -1, 1, 1]))
    s = op.Add(op.Range(op.Squeeze(zero), op.Squeeze(seq), op.Squeeze(one)), start)  # [S] rows start + s
    s = op.Reshape(s, op.Constant(value_ints=[1, 1, -1, 1]))
    indices = op.Concat(op.Expand(zero, grid), op.Expand(h, grid), op.Expand(s, grid), axis=-1)  # [1, H, S, 3]
    return op.ScatterND(past, indices, new)


def _gqa_onnx(query: Any, key: Any, value: Any, past_key: Any, past_value: Any, seqlens_k: Any, num_heads: int,
              kv_num_heads: int, scale: float, local_window_size: int) -> Any:
    total = op.Cast(op.Squeeze(op.Shape(past_key, start=2, end=3)), to=6)  # int32 scalar: M
    return _GroupQueryAttention(query, key, value, past_key, past_value, seqlens_k, total, num_heads=num_heads,
                                kv_num_heads=kv_num_heads, scale=scale, local_window_size=local_window_size)


def _gqa_bias_onnx(query: Any, key: Any, value: Any, past_key: Any, past_value: Any, seqlens_k: Any,
                   attention_bias: Any, num_heads: int, kv_num_heads: int, scale: float) -> Any:
    total = op.Cast(op.Squeeze(op.Shape(past_key, start=2, end=3)), to=6)  # int32 scalar: M (the bias's last dim)
    return _GroupQueryAttentionBias(query, key, value, past_key, past_value, seqlens_k, total, None, None, None,
                                    attention_bias, num_heads=num_heads, kv_num_heads=kv_num_heads, scale=scale)


def _gqa_rotary_onnx(query: Any, key: Any, value: Any, past_key: Any, past_value: Any, seqlens_k: Any, cos_cache: Any,
                     sin_cache: Any, num_heads: int, kv_num_heads: int, scale: float) -> Any:
    total = op.Cast(op.Squeeze(op.Shape(past_key, start=2, end=3)), to=6)  # int32 scalar: M
    return _GroupQueryAttentionRotary(query, key, value, past_key, past_value, seqlens_k, total, cos_cache, sin_cache,
                                      num_heads=num_heads, kv_num_heads=kv_num_heads, do_rotary=1,
                                      rotary_interleaved=0, scale=scale)


TRANSLATIONS: dict[Callable[..., Any], Callable[..., Any]] = {
    torch.ops.specpack.kv_write.default: _kv_write_onnx,
    torch.ops.specpack.group_query_attention.default: _gqa_onnx,
    torch.ops.specpack.group_query_attention_bias.default: _gqa_bias_onnx,
    torch.ops.specpack.group_query_attention_rotary.default: _gqa_rotary_onnx,
}


# ------------------------------------------------------------------------------- attention for transformers


@dataclass
class StaticCacheState:
    """What the attention function of every layer reads during one traced forward."""

    form: str  # "gqa" | "standard"
    past: tuple[torch.Tensor, ...] = ()  # key_0, value_0, key_1, ...   [1, Hkv, M, D] each
    mask: torch.Tensor | None = None  # [1, M] int64: ones at [0, L + S)
    allowed: torch.Tensor | None = None  # [S, M] bool: the token tree's restriction (tree_allowed); None: causal
    presents: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def begin(self, mask: torch.Tensor, past: tuple[torch.Tensor, ...], allowed: torch.Tensor | None = None) -> None:
        self.mask, self.past, self.allowed, self.presents = mask, past, allowed, {}

    def ordered_presents(self) -> list[torch.Tensor]:
        return [t for layer in sorted(self.presents) for t in self.presents[layer]]


def make_attention(state: StaticCacheState) -> Callable[..., tuple[torch.Tensor, None]]:
    """An attention function for transformers' AttentionInterface that reads and writes the static cache."""

    def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                  **kwargs: Any) -> tuple[torch.Tensor, None]:
        # query [1, Hq, S, D]; key, value [1, Hkv, S, D] (rotary applied); attention_mask: unused (None)
        layer = int(module.layer_idx)  # type: ignore[arg-type]
        past_key, past_value = state.past[2 * layer], state.past[2 * layer + 1]
        assert state.mask is not None, "StaticCacheState.begin() was not called"
        scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
        window = kwargs.get("sliding_window")
        total = state.mask.sum(dim=-1)  # [1] L + S
        seq, num_heads, head_dim = query.shape[2], query.shape[1], query.shape[3]
        if state.allowed is not None and window:
            _check_tree_window(module, window)
            window = None
        if state.form == "gqa" and state.allowed is not None:
            kv_heads = past_key.shape[1]
            out, present_key, present_value = torch.ops.specpack.group_query_attention_bias(
                query.transpose(1, 2).reshape(1, seq, num_heads * head_dim),
                key.transpose(1, 2).reshape(1, seq, kv_heads * head_dim),
                value.transpose(1, 2).reshape(1, seq, kv_heads * head_dim),
                past_key, past_value, (total - 1).to(torch.int32), tree_bias(state.allowed, query.dtype),
                num_heads, kv_heads, scale)
            out = out.view(1, seq, num_heads, head_dim)
        elif state.form == "gqa":
            kv_heads = past_key.shape[1]
            out, present_key, present_value = torch.ops.specpack.group_query_attention(
                query.transpose(1, 2).reshape(1, seq, num_heads * head_dim),
                key.transpose(1, 2).reshape(1, seq, kv_heads * head_dim),
                value.transpose(1, 2).reshape(1, seq, kv_heads * head_dim),
                past_key, past_value, (total - 1).to(torch.int32), num_heads, kv_heads, scale,
                window if window else -1)
            out = out.view(1, seq, num_heads, head_dim)  # local_window_size = window: onnxruntime-genai's
            # convention, measured on ONNX Runtime 1.32's CPU kernel (tests/export/test_static_export.py)
        else:
            start = total - shape_value(seq, query.device)  # [1] L (a shape value mixed into device data: via a Range)
            present_key, present_value = (torch.ops.specpack.kv_write(past, new, start)
                                          for past, new in ((past_key, key), (past_value, value)))
            out, _, _ = standard_attention(query, None, None, present_key, present_value, start, scale, window,
                                  state.allowed)
        state.presents[layer] = (present_key, present_value)
        return out, None  # [1, S, Hq, D]

    return attention


def _check_tree_window(module: torch.nn.Module, window: int) -> None:
    """A tree verify graph has no sliding window: a node's cache row is not its position, so a window counted in
    rows would cut the wrong keys. A window no context can reach (>= max_position_embeddings, Mistral's default
    4096 on short-context models) may be dropped; any other is refused."""
    limit = getattr(getattr(module, "config", None), "max_position_embeddings", None)
    if isinstance(limit, int) and window >= limit:
        return
    raise SpecpackError("the tree verify graph does not support sliding-window attention",
                        expected=f"sliding_window >= max_position_embeddings ({limit})",
                        found=f"sliding_window {window}", hint="export without --max-tree-nodes")


def standard_attention(query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None, cache_key: torch.Tensor,
              cache_value: torch.Tensor, start: torch.Tensor, scale: float, window: int | None,
              allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention of query [1, Hq, S, D] (rows start..start+S-1) over a static cache [1, Hkv, M, D].

    key / value [1, Hkv, S, D] are written into the cache first (rows [start, start + S)), unless None
    (already written). `allowed` [S, M] bool narrows the causal mask further (a token tree: tree_allowed).
    -> out [1, S, Hq, D], the cache key, the cache value. Grouped heads share a K / V head through a reshape
    (query head h reads kv head h // G), never by repeating the cache."""
    if key is not None and value is not None:
        cache_key = torch.ops.specpack.kv_write(cache_key, key, start)
        cache_value = torch.ops.specpack.kv_write(cache_value, value, start)
    _, num_heads, seq, head_dim = query.shape
    kv_heads, max_len = cache_key.shape[1], cache_key.shape[2]
    groups = num_heads // kv_heads
    q = query.reshape(1, kv_heads, groups * seq, head_dim)  # [1, Hkv, G*S, D]
    scores = torch.matmul(q, cache_key.transpose(2, 3)) * scale  # [1, Hkv, G*S, M]
    scores = scores.view(1, kv_heads, groups, seq, max_len)
    row = start.view(1, 1) + torch.arange(seq, device=query.device).view(1, seq)  # [1, S] cache row of each query
    col = torch.arange(max_len, device=query.device).view(1, 1, max_len)  # [1, 1, M]
    visible = col <= row.unsqueeze(-1)  # [1, S, M] causal, and nothing at or past L + S
    if window:
        visible = visible & (col > row.unsqueeze(-1) - window)
    if allowed is not None:
        visible = visible & allowed.view(1, seq, max_len)
    scores = scores.masked_fill(~visible.view(1, 1, 1, seq, max_len), torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores.float(), dim=-1).to(query.dtype).view(1, kv_heads, groups * seq, max_len)
    out = torch.matmul(probs, cache_value)  # [1, Hkv, G*S, D]
    return out.view(1, num_heads, seq, head_dim).transpose(1, 2), cache_key, cache_value


# ------------------------------------------------------------------------------------------- token trees


def tree_ancestors(parents: torch.Tensor, rounds: int) -> torch.Tensor:
    """tree_oracle.ancestors in torch: parents int64 [T] (topological, -1: the root) -> [T, T] bool, A[j, i] iff i is
    j or an ancestor of j. Pointer doubling, unrolled `rounds` times (graphs/tree_head.py's ancestor_mask):

        P = parents < 0 ? self : parents;  A = (i == j) or (i == P[j])
        repeat rounds:  A = A | A[P];  P = P[P]
    """
    index = torch.arange(parents.shape[0], device=parents.device)  # [T]
    up = torch.where(parents < 0, index, parents)  # [T] the root's children point at themselves
    anc = (index.view(-1, 1) == index.view(1, -1)) | (up.view(-1, 1) == index.view(1, -1))  # [T, T]
    for _ in range(rounds):
        anc = anc | anc.index_select(0, up)
        up = up.index_select(0, up)
    return anc


def tree_allowed(anc: torch.Tensor, seq: int, end: torch.Tensor, max_len: int) -> torch.Tensor:
    """[S, M] bool: which cache rows each of the run's S rows may read beyond the causal mask. The run's last T rows
    are the tree's nodes (cache rows first .. first + T - 1, first = end - T, end = L + S the mask's ones); a node
    reads a node row only when that node is its ancestor or itself. Every other pair is left to the causal mask (True).

        a[c]  = c - first if first <= c < first + T else T                      [M] node of cache row c (T: none)
        ext   = [[1 (S-T rows, T+1 cols)], [A | 1]]                              [S, T+1]
        allowed = ext[:, a]                                                      [S, M]

    Shape values (T, M) enter the data only through a Range over them (shape_value): a shape scalar mixed into
    device data directly makes ONNX Runtime's CUDA EP copy it from the host mid-graph, and refuse the CUDA graph.
    """
    nodes = anc.shape[0]
    count = shape_value(nodes, anc.device)  # [1] T, on the device
    first = end - count  # [1]
    node = torch.arange(max_len, device=anc.device) - first  # [M]
    node = torch.where((node >= 0) & (node < count), node, torch.zeros_like(node) + count)
    chain = torch.ones(seq - nodes, nodes + 1, dtype=torch.bool, device=anc.device)  # rows before the nodes
    tree = torch.cat([anc, torch.ones(nodes, 1, dtype=torch.bool, device=anc.device)], dim=1)  # [T, T+1]
    return torch.cat([chain, tree], dim=0).index_select(1, node)


def shape_value(value: int, device: torch.device) -> torch.Tensor:
    """[1] int64 holding a shape value, made by a Range over shapes (computed on the device: no host copy)."""
    return torch.arange(value, value + 1, device=device)


def tree_bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """GroupQueryAttention's attention_bias from tree_allowed: [S, M] bool -> [1, 1, S, M], 0 where allowed, else the
    dtype's lowest value (added to the causal scores: exp underflows to 0)."""
    low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return torch.where(allowed, torch.zeros((), dtype=dtype, device=allowed.device), low)[None, None]


def tree_positions(position_ids: torch.Tensor, anc: torch.Tensor) -> torch.Tensor:
    """position_ids [1, S] with the last T (the nodes') replaced by the root's position + each node's depth: a node
    sits where it would sit on its own root path. The root is row S - T - 1; a chain gets its own positions back."""
    seq, nodes = position_ids.shape[1], anc.shape[0]
    root = position_ids[:, seq - nodes - 1: seq - nodes]  # [1, 1]
    depth = anc.sum(dim=1, keepdim=True).view(1, -1)  # [1, T] 1 for the root's children (keepdim: the CUDA EP
    # refuses a ReduceSum without keepdims over an empty axis, as a chain step with T = 0 gives)
    return torch.cat([position_ids[:, : seq - nodes], root + depth], dim=1)
