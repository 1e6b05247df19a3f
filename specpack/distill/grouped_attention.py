"""Decode-step attention for the target's data generation without copying the key/value heads per query head.

transformers' sdpa attention, given a padding mask (every batched, left-padded generation has one), repeats each
key/value head for each of its query heads before calling scaled_dot_product_attention (its GQA flag needs no mask on
CUDA). At a decode step of 1,024 rows that copy is the step's largest memory traffic (the 1.5B target: 2 key/value
heads, 12 query heads, so six copies of the whole cache per layer and step). Here, for one new token per row, the
G = H / Hkv query heads of a key/value head become G query rows of that head, which is the same attention:

    query [B, H, 1, D] -> [B, Hkv, G, D]    key, value [B, Hkv, L, D] as they are    mask [B, 1, 1, L] broadcast

Prefill (several new tokens) and models without grouped heads run transformers' own sdpa function unchanged, so the
training's forward passes (which read the target's features) are transformers' own. Registered under IMPLEMENTATION;
`use_grouped_decode(model)` switches a loaded model to it (bench/README.md, "Data generation's attention").
"""

from __future__ import annotations

from typing import Any

IMPLEMENTATION = "specpack_grouped_sdpa"


def grouped_decode_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                             dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                             **kwargs: Any) -> tuple[Any, None]:
    """transformers' attention-function signature; returns ([B, Q, H, D], None) as its sdpa function does."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = int(getattr(module, "num_key_value_groups", 1))
    per_head_mask = attention_mask is not None and attention_mask.shape[1] != 1
    if query.shape[2] != 1 or groups == 1 or per_head_mask or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    batch, heads, _, dim = query.shape
    grouped = query.reshape(batch, heads // groups, groups, dim)  # [B, Hkv, G, D]
    mask = None if attention_mask is None else attention_mask[:, :, :, : key.shape[-2]]  # [B, 1, 1, L]
    out = torch.nn.functional.scaled_dot_product_attention(
        grouped, key, value, attn_mask=mask, dropout_p=dropout if module.training else 0.0, scale=scaling)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None  # [B, 1, H, D]


def use_grouped_decode(model: Any) -> None:
    """Register the function (and sdpa's mask for it) with transformers, then switch `model` to it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, grouped_decode_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    model.set_attn_implementation(IMPLEMENTATION)
